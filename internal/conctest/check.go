package conctest

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Partition splits a history into the histories of its keys ("key:<key>") and its
// message ids ("msg:<id>"). Operations of neither (send, maintain) are left out. A
// history is linearizable against the models if each partition is: no operation
// touches two keys or two messages (a call that does, such as a listing, is recorded
// as one operation per message).
func Partition(history []Op) map[string][]Op {
	parts := map[string][]Op{}
	for _, o := range history {
		switch {
		case o.In.Key != "":
			parts["key:"+o.In.Key] = append(parts["key:"+o.In.Key], o)
		case o.In.Msg != "" && o.In.Kind != OpSend:
			parts["msg:"+o.In.Msg] = append(parts["msg:"+o.In.Msg], o)
		}
	}
	return parts
}

// modelOf returns the model of a partition.
func modelOf(partition string) porcupine.Model {
	if strings.HasPrefix(partition, "key:") {
		return KeyModel
	}
	return MessageModel
}

// Violation is a partition whose history no sequential order explains (Illegal), or
// one the checker could not decide in time (Unknown).
type Violation struct {
	Partition string
	Result    porcupine.CheckResult
	Ops       []Op // the partition's whole history, by call time
	// Shrunk is a shorter part of Ops that no order explains either (Shrink).
	Shrunk []Op
	info   porcupine.LinearizationInfo
}

// Stats says how long the check of a history took: in all, and for its slowest
// partition.
type Stats struct {
	Partitions  int
	Took        time.Duration
	Slowest     string
	SlowestOps  int
	SlowestTook time.Duration
}

// Check checks every partition of history against its model, each for at most
// timeout, and returns the violations, sorted by partition.
func Check(history []Op, timeout time.Duration) ([]Violation, Stats) {
	var out []Violation
	var st Stats
	began := time.Now()
	for name, ops := range Partition(history) {
		sortByCall(ops)
		t0 := time.Now()
		res, info := porcupine.CheckOperationsVerbose(modelOf(name), operations(ops), timeout)
		st.Partitions++
		if d := time.Since(t0); d > st.SlowestTook {
			st.Slowest, st.SlowestOps, st.SlowestTook = name, len(ops), d
		}
		if res == porcupine.Ok {
			continue
		}
		v := Violation{Partition: name, Result: res, Ops: ops, info: info}
		if res == porcupine.Illegal {
			v.Shrunk = Shrink(name, ops, timeout)
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Partition < out[j].Partition })
	st.Took = time.Since(began)
	return out, st
}

func sortByCall(ops []Op) {
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
}

// operations converts ops to porcupine's form; each (process, worker) is one client.
func operations(ops []Op) []porcupine.Operation {
	clients := map[[2]int]int{}
	out := make([]porcupine.Operation, len(ops))
	for i, o := range ops {
		k := [2]int{o.Proc, o.Worker}
		c, ok := clients[k]
		if !ok {
			c = len(clients)
			clients[k] = c
		}
		out[i] = porcupine.Operation{ClientId: c, Input: o.In, Call: o.Call, Output: o.Out, Return: o.Return}
	}
	return out
}

// illegal reports whether the checker finds no order that explains ops.
func illegal(model porcupine.Model, ops []Op, timeout time.Duration) bool {
	return porcupine.CheckOperationsTimeout(model, operations(ops), timeout) == porcupine.Illegal
}

// Shrink returns a part of the illegal history ops that is illegal too, and whose
// being illegal implies that ops is: it removes, one at a time while the rest stays
// illegal, operations that change no state (Observer) and operations that began after
// every other one returned (nothing can be ordered after them). What is left are the
// calls that changed the state and the few answers that contradict them.
func Shrink(partition string, ops []Op, timeout time.Duration) []Op {
	model := modelOf(partition)
	cur := append([]Op(nil), ops...)
	budget := 4 * len(ops)
	for changed := true; changed && budget > 0; {
		changed = false
		for i := len(cur) - 1; i >= 0 && budget > 0; i-- {
			if !Observer(cur[i]) && !last(cur, i) {
				continue
			}
			rest := append(append([]Op(nil), cur[:i]...), cur[i+1:]...)
			budget--
			if illegal(model, rest, timeout) {
				cur, changed = rest, true
			}
		}
	}
	return cur
}

// last reports whether ops[i] was called after every other operation of ops returned.
func last(ops []Op, i int) bool {
	for j, o := range ops {
		if j != i && o.Return >= ops[i].Call {
			return false
		}
	}
	return true
}

// Report describes v in a few lines: its partition, how long its history is, and
// the shrunk history, one operation a line, times relative to start (Mono ns, the
// run's start).
func (v Violation) Report(start int64) string {
	var b strings.Builder
	if v.Result != porcupine.Illegal {
		fmt.Fprintf(&b, "%s: the checker could not decide its %d operations in time (%s)\n", v.Partition, len(v.Ops), v.Result)
		return b.String()
	}
	fmt.Fprintf(&b, "%s: no sequential order explains its %d operations; these %d of them (from %.3f s into the run) are already unexplainable:\n",
		v.Partition, len(v.Ops), len(v.Shrunk), float64(v.Shrunk[0].Call-start)/1e9)
	for _, o := range v.Shrunk {
		o.Call, o.Return = o.Call-start, o.Return-start
		fmt.Fprintf(&b, "  %s\n", o)
	}
	return b.String()
}

// Visualize writes porcupine's HTML view of v's whole history to path.
func (v Violation) Visualize(path string) error {
	return porcupine.VisualizePath(modelOf(v.Partition), v.info, path)
}

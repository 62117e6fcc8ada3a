package conctest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The kinds of operations a history holds. Those of an idempotency key (Key set) form
// its partition, those of a message id (Msg set) its own; send and maintain are in no
// partition: the explorer checks them itself.
const (
	OpBegin    = "begin"    // store.BeginOperation(Key, request body number Body)
	OpComplete = "complete" // store.CompleteOperation(OpID, Resp) by the caller that began it
	OpRelease  = "release"  // store.ReleaseOperation(OpID) by the caller that began it
	OpEnqueue  = "enqueue"  // store.Enqueue of message Msg with its envelope set number Variant
	OpMessage  = "message"  // store.Message(Msg)
	OpAccepted = "accepted" // store.AcceptedMessage(Msg)
	// OpMessageSummary is message Msg's entry (or its absence) in one call of
	// store.MessageSummaries; OpOutboxSummary its envelopes in one call of
	// store.OutboxSummaries. One call gives one such operation per message of the space,
	// all with the call's times.
	OpMessageSummary = "message-summary"
	OpOutboxSummary  = "outbox-summary"
	// OpAction is carrier.Apply of operator action Action: Msg's result of a call that
	// named it, or (Target set) of a call that selected a target.
	OpAction = "action"
	// OpInbound is an inbound delivery-status for Msg confirming envelope set Variant
	// (-1: signed by someone other than the message's recipient), applied as the
	// daemon's inbox follower applies one; Conf numbers the confirmation envelope, so a
	// second delivery of the same one is a duplicate.
	OpInbound  = "inbound"
	OpMaintain = "maintain" // store.Maintain
	OpSend     = "send"     // the scripted relay answered envelope Env of Msg with Outcome
)

// Answers of an operation (Output.Outcome) beyond its error code.
const (
	OutcomeApplied   = "applied"   // inbound: the confirmation moved (or found) the message delivered
	OutcomeRefused   = "refused"   // inbound: it confirmed no message of ours
	OutcomeDuplicate = "duplicate" // inbound: its receipt was stored already
)

// Input is what an operation was asked to do. Only the fields of its Kind are set.
type Input struct {
	Kind string `json:"kind"`
	Key  string `json:"key,omitempty"`
	Body int    `json:"body,omitempty"`
	OpID string `json:"opId,omitempty"`
	Resp string `json:"resp,omitempty"`
	Msg  string `json:"msg,omitempty"`
	// Variant is the envelope set of an enqueue, or the one an inbound confirmation
	// confirms (-1: forged).
	Variant int `json:"variant"`
	// An enqueue's envelope set: how many envelopes, its delivery deadline (Unix ms),
	// and whether its relay may refuse it (so that the carrier may close it "refused").
	Envelopes int    `json:"envelopes,omitempty"`
	Deadline  int64  `json:"deadline,omitempty"`
	Refusable bool   `json:"refusable,omitempty"`
	Action    string `json:"action,omitempty"`
	Target    string `json:"target,omitempty"`
	Conf      int    `json:"conf,omitempty"`
	Env       string `json:"env,omitempty"`
}

// Output is what an operation answered. Code is the errcode code of the error it
// returned ("" for none; "UNCODED" for an error without a code) and Err its text.
type Output struct {
	Code string `json:"code,omitempty"`
	Err  string `json:"err,omitempty"`
	// begin: the operation id and, Done, its stored response.
	OpID string `json:"opId,omitempty"`
	Done bool   `json:"done,omitempty"`
	Resp string `json:"resp,omitempty"`
	// Reads and enqueue: whether the message was found, and as what: its envelope set
	// (from its digest; -1 unknown), status, closer and hold.
	Found    bool   `json:"found,omitempty"`
	Variant  int    `json:"variant"`
	Status   string `json:"status,omitempty"`
	ClosedBy string `json:"closedBy,omitempty"`
	Held     bool   `json:"held,omitempty"`
	// outbox-summary: bit v set when an envelope of set v was listed.
	Variants uint64 `json:"variants,omitempty"`
	// action: the message's result (its code, what changed, the note).
	Outcome string `json:"outcome,omitempty"`
	Changed int    `json:"changed,omitempty"`
	Note    string `json:"note,omitempty"`
	// Wall is the wall clock (Unix ms) when the operation returned: deadlines are
	// judged by it.
	Wall int64 `json:"wall"`
}

// Op is one operation of a history: who called it, when (CLOCK_MONOTONIC
// nanoseconds, comparable across the processes of one machine), with what, and what
// it answered.
type Op struct {
	Proc   int    `json:"proc"`
	Worker int    `json:"worker"`
	Call   int64  `json:"call"`
	Return int64  `json:"return"`
	In     Input  `json:"in"`
	Out    Output `json:"out"`
}

// String is the operation on one line, for failure reports.
func (o Op) String() string {
	return fmt.Sprintf("[%s–%s] p%d/w%d %s → %s", ms(o.Call), ms(o.Return), o.Proc, o.Worker, o.In, o.Out.describe(o.In.Kind))
}

func ms(ns int64) string { return fmt.Sprintf("%d.%03d ms", ns/1e6, ns/1e3%1e3) }

// String is the call in words.
func (in Input) String() string {
	switch in.Kind {
	case OpBegin:
		return fmt.Sprintf("begin(%s, request %d)", in.Key, in.Body)
	case OpComplete:
		return fmt.Sprintf("complete(%s of %s, %s)", in.OpID, in.Key, in.Resp)
	case OpRelease:
		return fmt.Sprintf("release(%s of %s)", in.OpID, in.Key)
	case OpEnqueue:
		return fmt.Sprintf("enqueue(%s, variant %d: %d envelopes)", in.Msg, in.Variant, in.Envelopes)
	case OpMessage, OpAccepted:
		return fmt.Sprintf("%s(%s)", in.Kind, in.Msg)
	case OpMessageSummary, OpOutboxSummary:
		return fmt.Sprintf("%ss[%s]", in.Kind, in.Msg)
	case OpAction:
		if in.Target != "" {
			return fmt.Sprintf("%s(target %s)[%s]", in.Action, in.Target, in.Msg)
		}
		return fmt.Sprintf("%s(%s)", in.Action, in.Msg)
	case OpInbound:
		return fmt.Sprintf("inbound(%s, confirming variant %d, envelope %d)", in.Msg, in.Variant, in.Conf)
	case OpSend:
		return fmt.Sprintf("send(%s of %s to %s)", in.Env, in.Msg, in.Target)
	}
	return in.Kind + "()"
}

// describe is the answer to a call of kind in words.
func (o Output) describe(kind string) string {
	if o.Code != "" {
		if o.Code == "UNCODED" {
			return "error: " + o.Err
		}
		return o.Code
	}
	switch kind {
	case OpBegin:
		if o.Done {
			return fmt.Sprintf("done %s with %s", o.OpID, o.Resp)
		}
		return "started " + o.OpID
	case OpEnqueue, OpMessage, OpAccepted, OpMessageSummary:
		if !o.Found {
			return "absent"
		}
		s := o.Status
		if o.ClosedBy != "" {
			s += " (" + o.ClosedBy + ")"
		}
		if o.Held {
			s += ", held"
		}
		if o.Variant >= 0 {
			s = fmt.Sprintf("variant %d, %s", o.Variant, s)
		}
		return s
	case OpOutboxSummary:
		var vs []string
		for v := 0; v < 64; v++ {
			if o.Variants&(1<<v) != 0 {
				vs = append(vs, fmt.Sprint(v))
			}
		}
		if vs == nil {
			return "no envelopes"
		}
		return "envelopes of variants " + strings.Join(vs, ", ")
	case OpAction:
		s := o.Outcome
		if s == "" {
			s = "ok"
		}
		s += fmt.Sprintf(", %d changed", o.Changed)
		if o.Note != "" {
			s += ": " + o.Note
		}
		return s
	case OpInbound, OpSend:
		return o.Outcome
	}
	return "ok"
}

// Mono returns CLOCK_MONOTONIC in nanoseconds: one clock for every process of the
// machine, which never goes back.
func Mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("conctest: clock_gettime(CLOCK_MONOTONIC): %v", err))
	}
	return ts.Nano()
}

// Recorder collects one process's history. It is safe for concurrent use.
type Recorder struct {
	proc int
	mu   sync.Mutex
	ops  []Op
}

// NewRecorder returns an empty recorder for process proc.
func NewRecorder(proc int) *Recorder { return &Recorder{proc: proc} }

// Do calls fn, recording in and fn's answer with the call's times.
func (r *Recorder) Do(worker int, in Input, fn func() Output) Output {
	call := Mono()
	out := fn()
	r.Add(worker, call, Mono(), in, out)
	return out
}

// Add records one operation that ran from call to ret (Mono times). Out.Wall is set
// to now if it is zero.
func (r *Recorder) Add(worker int, call, ret int64, in Input, out Output) {
	if out.Wall == 0 {
		out.Wall = time.Now().UnixMilli()
	}
	r.mu.Lock()
	r.ops = append(r.ops, Op{Proc: r.proc, Worker: worker, Call: call, Return: ret, In: in, Out: out})
	r.mu.Unlock()
}

// Ops returns a copy of the history recorded so far.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.ops...)
}

// WriteFile writes ops to path as JSON lines (a test's history file: no durability
// is claimed, the file is read back after the process exited).
func WriteFile(path string, ops []Op) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for _, o := range ops {
		if err := enc.Encode(o); err != nil {
			return err
		}
	}
	return os.WriteFile(path, b.Bytes(), 0o600)
}

// ReadFile reads a history written by WriteFile.
func ReadFile(path string) ([]Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ops []Op
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var o Op
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		ops = append(ops, o)
	}
	return ops, sc.Err()
}

// Merge returns the histories as one, ordered by call time.
func Merge(histories ...[]Op) []Op {
	var all []Op
	for _, h := range histories {
		all = append(all, h...)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Call < all[j].Call })
	return all
}

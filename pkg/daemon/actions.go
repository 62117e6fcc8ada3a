package daemon

// The operator's actions on the queue (docs/DAEMON.md "Queue actions", DESIGN §11):
// POST /v1/queue/{hold,release,cancel,retry}. Each is carrier.Apply: durable store
// transactions, idempotent, refusals per message with a stable code.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/carrier"
	"github.com/sealbridge/sealbridge/pkg/client"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/relayproto"
)

// Limits of an action request.
const (
	// maxActionIDs bounds the message ids of one request.
	maxActionIDs = 1000
	// maxActionBytes bounds its body: maxActionIDs quoted ids, a target URL and a
	// reason, with room to spare.
	maxActionBytes = 64 << 10
)

// peerKey is the request-context key of the connection's peer uid (SO_PEERCRED).
type peerKey struct{}

// peerConn is an accepted connection and its peer's uid.
type peerConn struct {
	*net.UnixConn
	uid int
}

// connContext carries the peer uid of a unix-socket connection into its requests.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if pc, ok := c.(*peerConn); ok {
		return context.WithValue(ctx, peerKey{}, pc.uid)
	}
	return ctx
}

// caller is who asked for r: "uid:<peer uid>" as the socket's SO_PEERCRED gave it.
// A request that came in any other way (a test's handler) is this process's uid:
// the daemon serves only its owner's uid.
func caller(r *http.Request) string {
	uid, ok := r.Context().Value(peerKey{}).(int)
	if !ok {
		uid = os.Getuid()
	}
	return "uid:" + strconv.Itoa(uid)
}

// serveAction returns the handler of POST /v1/queue/<op>.
func (d *Daemon) serveAction(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req client.ActionRequest
		if !readBody(w, r, maxActionBytes, &req, "{messageIds | target, reason}") {
			return
		}
		if req.Target != "" {
			canon, err := relayproto.CanonicalRelayURL(req.Target)
			if err != nil {
				writeErrorHint(w, http.StatusBadRequest, relayproto.CodeRelayURLInvalid, "target: "+err.Error(), relayproto.RelayURLFix(err))
				return
			}
			req.Target = canon
		}
		sel, msg := actionSelector(req)
		if msg != "" {
			writeError(w, http.StatusBadRequest, codeBadRequest, msg)
			return
		}
		a := record.Action{Op: op, By: caller(r), At: time.Now().UnixMilli(), Reason: req.Reason}
		// Act kicks the carrier after a release or a retry, and has a retry's
		// messages attempted at once.
		results, err := d.car.Act(r.Context(), sel, a)
		if err != nil {
			d.writeStoreError(w, err)
			return
		}
		out := client.ActionAnswer{Action: op, Results: make([]client.ActionResult, 0, len(results))}
		for _, res := range results {
			out.Results = append(out.Results, client.ActionResult{MessageID: res.MessageID, Changed: res.Changed,
				Code: res.Code, Message: res.Message, Effect: res.Effect, InFlight: res.InFlight})
			if res.Changed > 0 {
				d.actionChange(res.MessageID)
			}
		}
		d.log.Info("api: queue action", "action", op, "by", a.By, "messages", len(results), "target", sel.Target)
		writeJSON(w, http.StatusOK, out)
	}
}

// actionChange reports message id, which an action changed, in the change feed at
// once (the detector would find it too).
func (d *Daemon) actionChange(id string) {
	m, err := d.st.Message(id)
	if err != nil || m == nil {
		return // the detector reports what it finds
	}
	d.recordChange(client.TopicMessages, id, m.Status)
}

// actionSelector checks an action request and returns its selector, or why it is
// refused.
func actionSelector(req client.ActionRequest) (carrier.Selector, string) {
	switch {
	case len(req.MessageIDs) == 0 && req.Target == "":
		return carrier.Selector{}, "give messageIds or target"
	case len(req.MessageIDs) > 0 && req.Target != "":
		return carrier.Selector{}, "give messageIds or target, not both"
	case len(req.MessageIDs) > maxActionIDs:
		return carrier.Selector{}, fmt.Sprintf("at most %d messageIds per request", maxActionIDs)
	case len(req.Reason) > record.MaxActionReason:
		return carrier.Selector{}, fmt.Sprintf("reason over %d bytes", record.MaxActionReason)
	case !utf8.ValidString(req.Reason) || strings.ContainsFunc(req.Reason, func(c rune) bool { return c < 0x20 || c == 0x7f }):
		return carrier.Selector{}, "reason must be one line of text"
	case req.Target != "" && !record.ValidRelayURL(req.Target):
		return carrier.Selector{}, "target must be an http(s) relay URL"
	}
	var ids []string
	for _, id := range req.MessageIDs {
		if !uuid.Valid(id) {
			return carrier.Selector{}, "message id " + strconv.Quote(id) + " is not a lower-case UUID"
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return carrier.Selector{MessageIDs: ids, Target: req.Target}, ""
}

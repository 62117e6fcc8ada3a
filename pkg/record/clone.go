package record

import (
	"bytes"
	"encoding/json"
	"slices"
)

// Clone returns a deep copy of r, so callers never share the cache's values.
func Clone(r Record) Record {
	switch v := r.(type) {
	case *Outbox:
		c := *v
		c.Envelope = bytes.Clone(v.Envelope)
		if v.Lease != nil {
			l := *v.Lease
			c.Lease = &l
		}
		c.Held, c.Operator = CloneAction(v.Held), CloneAction(v.Operator)
		return &c
	case *Batch:
		c := *v
		c.EnvelopeIDs = slices.Clone(v.EnvelopeIDs)
		return &c
	case *Message:
		c := *v
		c.Held, c.Operator = CloneAction(v.Held), CloneAction(v.Operator)
		return &c
	case *Receipt:
		c := *v
		return &c
	case *Observation:
		c := *v
		c.Facts = make([]json.RawMessage, len(v.Facts))
		for i, f := range v.Facts {
			c.Facts[i] = bytes.Clone(f)
		}
		c.Published = slices.Clone(v.Published)
		if v.Blob != nil {
			b := *v.Blob
			c.Blob = &b
		}
		return &c
	case *Operation:
		c := *v
		c.Response = bytes.Clone(v.Response)
		return &c
	case *Binding:
		c := *v
		return &c
	case *Refusal:
		c := *v
		c.Envelope = bytes.Clone(v.Envelope)
		return &c
	}
	return r
}

// CloneAction returns a copy of a (nil for nil).
func CloneAction(a *Action) *Action {
	if a == nil {
		return nil
	}
	c := *a
	return &c
}

package fsck

import (
	"bytes"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// blobBody is how every blob body starts in a canonical envelope's payload: only an
// outbox envelope holding it is parsed (envelope.Parse, the one reading of an
// envelope) to learn its blob, so records with inline bodies cost nothing more.
var blobBody = []byte(`"body":{"blob":"`)

// blobRefsOf returns the blobs that the valid record rec (at path p) names, as the
// store counts references: an outbox record whose envelope has a blob body
// ((*envelope.Envelope).Blob), and an observation with Blob set. An outbox envelope
// that holds a blob body but does not parse is an error: the store cannot tell what
// it refers to (its maintenance then removes no blob) and the carrier cannot send it.
func blobRefsOf(p string, rec record.Record) ([]blobRef, error) {
	switch v := rec.(type) {
	case *record.Outbox:
		if !bytes.Contains(v.Envelope, blobBody) {
			return nil, nil
		}
		env, err := envelope.Parse(v.Envelope)
		if err != nil {
			return nil, err
		}
		if ref, ok := env.Blob(); ok {
			return []blobRef{{path: p, digest: ref.Digest, size: ref.Size, needed: v.State == record.StatePending, state: v.State}}, nil
		}
	case *record.Observation:
		if v.Blob != nil {
			return []blobRef{{path: p, digest: v.Blob.Digest, size: v.Blob.Size, needed: true}}, nil
		}
	}
	return nil, nil
}

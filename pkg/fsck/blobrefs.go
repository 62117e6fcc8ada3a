package fsck

import "github.com/sealbridge/sealbridge/pkg/record"

// blobRefsOf returns the blobs that the valid record rec (at path p) names.
// TODO(fsck): envelope.Blob and record.ObservedBlob land with the lead's commit.
func blobRefsOf(p string, rec record.Record) []blobRef { return nil }

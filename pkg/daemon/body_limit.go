package daemon

import (
	"fmt"
	"net/http"

	"github.com/sealbridge/sealbridge/internal/bytesize"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// DefaultMaxBody is Options.MaxBody's default (sealbridged --max-body): 4 GiB.
const DefaultMaxBody int64 = 4 << 30

// checkMaxBody refuses a MaxBody out of its bounds (0 is the default): below
// envelope.MaxBodySize (the inline limit, always accepted) or above
// envelope.MaxBlobSize (the format's bound).
func checkMaxBody(n int64) error {
	if n == 0 || (n >= envelope.MaxBodySize && n <= envelope.MaxBlobSize) {
		return nil
	}
	return &OptionError{Option: "--max-body", Err: fmt.Errorf("%d bytes is out of range; give a size from %s to %s, e.g. 4GiB",
		n, bytesize.Format(envelope.MaxBodySize), bytesize.Format(envelope.MaxBlobSize))}
}

// maxBody is the limit in force on a large body's sealed size.
func (d *Daemon) maxBody() int64 { return d.opts.MaxBody }

// writeOverMaxBody answers a streamed send whose body is over the daemon's
// --max-body: 413 BODY_TOO_LARGE with the limit and a hint naming the flag.
func (d *Daemon) writeOverMaxBody(w http.ResponseWriter, msg string) {
	limit := d.maxBody()
	writeJSON(w, http.StatusRequestEntityTooLarge, map[string]any{"code": errcode.BodyTooLarge.String(), "message": msg,
		"limit": limit,
		"hint": fmt.Sprintf("this daemon takes a body of at most %d bytes (%s) sealed, which is the plaintext plus 16 bytes per 64 KiB "+
			"and a header of under 1 KiB: send a smaller body, or start sealbridged with a larger --max-body (the relay and "+
			"the recipient's daemon have their own --max-body)", limit, bytesize.Format(limit)),
	})
}

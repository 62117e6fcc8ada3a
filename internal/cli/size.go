package cli

import (
	"github.com/spf13/pflag"

	"github.com/sealbridge/sealbridge/internal/bytesize"
)

// ParseSize is bytesize.Parse: "4GiB", "512MiB", a number of bytes.
func ParseSize(s string) (int64, error) { return bytesize.Parse(s) }

// FormatSize is bytesize.Format.
func FormatSize(n int64) string { return bytesize.Format(n) }

// sizeValue is a pflag.Value of a byte size (ParseSize).
type sizeValue struct{ p *int64 }

func (v sizeValue) String() string {
	if v.p == nil {
		return ""
	}
	return FormatSize(*v.p)
}

func (v sizeValue) Set(s string) error {
	n, err := ParseSize(s)
	if err != nil {
		return err
	}
	*v.p = n
	return nil
}

func (v sizeValue) Type() string { return "size" }

// SizeVar defines a byte-size flag (ParseSize: "4GiB", "512MiB", bytes) with
// default def; its help shows the default as FormatSize writes it.
func SizeVar(fs *pflag.FlagSet, p *int64, name string, def int64, usage string) {
	*p = def
	fs.Var(sizeValue{p}, name, usage)
}

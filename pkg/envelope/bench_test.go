package envelope_test

import (
	"testing"

	"github.com/sealbridge/sealbridge/pkg/envelope"
)

func BenchmarkParseMessage(b *testing.B) {
	_, data := newMessage(b)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := envelope.Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseRefusedByte(b *testing.B) {
	_, data := newMessage(b)
	data[len(data)/3] ^= 1
	for b.Loop() {
		if _, err := envelope.Parse(data); err == nil {
			b.Fatal("accepted")
		}
	}
}

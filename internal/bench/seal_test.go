package bench

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"io"
	"testing"
	"time"

	"golang.org/x/crypto/chacha20poly1305"

	"github.com/sealbridge/sealbridge/internal/uuid"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// sealBytes is how much plaintext one iteration of the sealing benchmarks seals.
const sealBytes = 16 << 20

// BenchmarkSealBlob seals sealBytes of plaintext as a large body
// (envelope.NewBlobMessage: age's STREAM, 64 KiB chunks of ChaCha20-Poly1305,
// the SHA-256 of the sealed bytes, the file key wrapped with HPKE and the
// envelope signed once per body) into io.Discard, from one goroutine: one core.
func BenchmarkSealBlob(b *testing.B) {
	sender, _, peer := owner()
	plain := make([]byte, 1<<20)
	rand.Read(plain)
	b.SetBytes(sealBytes)
	b.ResetTimer()
	for range b.N {
		w, err := envelope.NewBlobMessage(sender, identity.DID(peer), uuid.NewString(), time.Now().Add(time.Hour), time.Now(), io.Discard)
		if err != nil {
			b.Fatal(err)
		}
		for n := 0; n < sealBytes; n += len(plain) {
			if _, err := w.Write(plain); err != nil {
				b.Fatal(err)
			}
		}
		if _, _, err := w.Finish(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportRate(b, float64(b.N)*sealBytes/(1<<20), "MiB/s")
}

// BenchmarkFloorAEAD is the floor of sealing: ChaCha20-Poly1305 (x/crypto, the
// AEAD age uses) over the same bytes in the same 64 KiB chunks, each with its
// own nonce, from one goroutine — no hashing, no framing, no key wrapping.
func BenchmarkFloorAEAD(b *testing.B) { sealChunks(b, false) }

// BenchmarkFloorAEADHash is BenchmarkFloorAEAD plus the SHA-256 of its output:
// the least any sealer of a body named by its digest does (the envelope signs
// the sealed bytes' SHA-256), from one goroutine.
func BenchmarkFloorAEADHash(b *testing.B) { sealChunks(b, true) }

func sealChunks(b *testing.B, hashed bool) {
	key := make([]byte, chacha20poly1305.KeySize)
	rand.Read(key)
	aead, err := chacha20poly1305.New(key)
	if err != nil {
		b.Fatal(err)
	}
	plain := make([]byte, envelope.BlobChunkSize)
	rand.Read(plain)
	out := make([]byte, 0, len(plain)+aead.Overhead())
	nonce := make([]byte, chacha20poly1305.NonceSize)
	b.SetBytes(sealBytes)
	b.ResetTimer()
	for range b.N {
		h := sha256.New()
		for i := 0; i < sealBytes/envelope.BlobChunkSize; i++ {
			binary.BigEndian.PutUint64(nonce[3:], uint64(i))
			out = aead.Seal(out[:0], nonce, plain, nil)
			if hashed {
				h.Write(out)
			}
		}
		h.Sum(nil)
	}
	b.StopTimer()
	reportRate(b, float64(b.N)*sealBytes/(1<<20), "MiB/s")
}

package record_test

import (
	"crypto/ed25519"
	"fmt"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// The worked example of docs/FORMAT.md: a message record signed by the owner whose
// Ed25519 seed is 32 bytes of 0x01.
func ExampleEncode() {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = 1
	}
	owner, _ := identity.FromSeed(seed)
	peer, _ := identity.FromSeed(make([]byte, ed25519.SeedSize))
	m := &record.Message{
		MessageID:        "0b6f2d8e-1c34-4a7b-9e21-3f5d6c7b8a90",
		Status:           record.StatusQueued,
		PeerOwnerDID:     string(peer.DID()),
		RelayURL:         "https://relay.example/",
		EnvelopeDigest:   envelope.Digest([]byte(`{"example":true}`)),
		DeliveryDeadline: 1767225600000,
		CreatedAt:        1767139200000,
		UpdatedAt:        1767139200000,
		RetainUntil:      1767830400000,
	}
	data, err := record.Encode(owner.Signer(), owner.DID(), m)
	if err != nil {
		panic(err)
	}
	fmt.Print(string(data))
	_, err = record.Parse(record.KindMessages, m.MessageID, data, owner.DID(), owner.Public())
	fmt.Println("valid:", err == nil)
	// Output:
	// {"v":1,"kind":"messages","id":"0b6f2d8e-1c34-4a7b-9e21-3f5d6c7b8a90","signer":"did:key:z6Mkon3Necd6NkkyfoGoHxid2znGc59LU3K7mubaRcFbLfLX","payload":{"messageId":"0b6f2d8e-1c34-4a7b-9e21-3f5d6c7b8a90","status":"queued","peerOwnerDid":"did:key:z6MkiTBz1ymuepAQ4HEHYSF1H8quG5GLVVQR3djdX3mDooWp","relayUrl":"https://relay.example/","envelopeDigest":"bba2d36669004a3ef16764b0dfe370dfc0c22263976dfd3d896370b3fa39be0d","deliveryDeadline":1767225600000,"createdAt":1767139200000,"updatedAt":1767139200000,"attempts":0,"retainUntil":1767830400000},"sig":"Wf7j9_Gro9jqdpYkANm_FReQ7YuVXWXOlRFiYtmZ5T_ljREFhCe37-pGhAaIfUjia0MOcdqFN6dd_K91Hj4qCw"}
	// valid: true
}

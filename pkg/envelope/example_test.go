package envelope_test

import (
	"bytes"
	"fmt"
	"time"

	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// Alice seals a message to Bob; Bob verifies and opens it and confirms its
// delivery; Alice checks the confirmation against her message.
func Example() {
	alice, _ := identity.FromSeed(bytes.Repeat([]byte{1}, 32))
	bob, _ := identity.FromSeed(bytes.Repeat([]byte{2}, 32))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	deadline := now.Add(72 * time.Hour)
	const messageID = "8f0c1a2b-3c4d-4e5f-8a6b-7c8d9e0f1a2b"

	// Alice: build, seal and sign; the bytes go to her outbox and the relay.
	_, wire, err := envelope.NewMessage(alice, bob.DID(), messageID, []byte("hi Bob"), deadline, now)
	if err != nil {
		panic(err)
	}
	digest := envelope.Digest(wire)

	// Bob: verify, check it is for him and not expired, open.
	msg, err := envelope.Parse(wire)
	if err != nil {
		panic(err)
	}
	if err := msg.CheckRecipient(bob.DID()); err != nil {
		panic(err)
	}
	if err := msg.CheckDeadline(now.Add(time.Minute)); err != nil {
		panic(err)
	}
	body, err := envelope.Open(bob, msg)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s from alice %t: %q\n", msg.Kind(), msg.Sender() == alice.DID(), body)

	// Bob: confirm delivery to Alice.
	_, statusWire, err := envelope.NewDeliveryStatus(bob, alice.DID(), envelope.ConfirmationOf(msg), deadline, now)
	if err != nil {
		panic(err)
	}

	// Alice: verify the status and that it confirms her message.
	status, err := envelope.Parse(statusWire)
	if err != nil {
		panic(err)
	}
	fmt.Println(status.Kind(), status.ConfirmsDelivery(alice.DID(), bob.DID(), messageID, digest) == nil)
	// Output:
	// message from alice true: "hi Bob"
	// delivery-status true
}

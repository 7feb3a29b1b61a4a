package client_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/client"
)

// A client of a three-replica coordinator: calls go to the leader, and a
// failover within ten seconds is only latency.
func ExampleDial_cluster() {
	c, err := client.Dial("coord-0.internal:7070,coord-1.internal:7070,coord-2.internal:7070",
		client.WithInsecurePlaintext(), // a service mesh encrypts; otherwise WithTLS
		client.WithToken("s3cret-alpha-token"),
		client.WithFailoverWait(10*time.Second),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	job, err := c.GetJob(ctx, "j-12")
	switch {
	case errors.Is(err, client.ErrNotLeader), errors.Is(err, client.ErrUnavailable):
		fmt.Println("no leader within the failover wait:", err)
	case err != nil:
		fmt.Println(err)
	default:
		fmt.Println(job.GetPhase())
	}
}

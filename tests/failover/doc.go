// Package failover is the failover campaign of a replicated coordinator:
// three coordinator processes on loopback (internal/clustertest), real
// renderer processes given every node's address, a submitter on the
// client library, fsync on everywhere, and the leader struck again and
// again: SIGKILLed and restarted on its data directory, isolated from its
// peers and healed, or SIGSTOPped for -pause-for and resumed. Its test,
// TestFailoverCampaign, checks the guarantees of a failover afterwards
// and prints its figures against their goals; docs/failover.md describes
// it and its last large run. TestHungLeaderCampaign hangs the leader
// instead: SIGSTOPped, its data filesystem frozen, or its gRPC path
// blackholed, each for -hang-for, after a run with no fault that must
// change no leader; and it hangs a follower that holds a batch of
// entries open in its store (SIGSTOPped, or its data filesystem frozen,
// for -follower-hang-for), which must change no leader either.
//
// Usage, from the repository root:
//
//	go test -v -run FailoverCampaign ./tests/failover              # 3 kills, 1 isolation, 1 pause
//	go test -v -timeout 60m -run FailoverCampaign ./tests/failover -kills 100 -isolations 20 -pauses 20
//	go test -v -run HungLeader ./tests/failover                    # 1 of each hang, 30 s with no fault
//	go test -v -run HungLeader ./tests/failover -stops 0 -freezes 0 -blackholes 0 -quiet 0 -follower-stops 5 -follower-freezes 5
//	go test -v -timeout 65m -run HungLeader ./tests/failover -stops 20 -freezes 20 -blackholes 20 -quiet 10m -burn 2
//
// With -short the campaign is skipped.
package failover

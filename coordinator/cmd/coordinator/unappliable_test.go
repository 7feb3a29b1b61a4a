package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/testbin"
)

// exitReplicaFailed is the documented exit status of a node that cannot
// store or apply the replicated log.
const exitReplicaFailed = 3

// forgeEntry speaks raft to the node at addr as member id, a leader of a
// later term, would, and makes it commit data as the entry after the last
// it holds: what any process that reached a raft port could do before the
// port required mutual TLS off loopback, and what a process on the machine
// still can on a loopback cluster, where no certificate says who a peer
// is. It returns the entry's index.
func forgeEntry(t *testing.T, addr, id string, data []byte) uint64 {
	t.Helper()
	trans, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer trans.Close()
	const term = 1 << 20
	header := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(id), Addr: []byte(addr)}
	target := raft.ServerAddress(addr)
	// The probe names a previous entry, so that it is no heartbeat: raft
	// takes no heartbeat of a later term (cluster's transport), and
	// answers this one, whatever its previous entry, with its last index.
	var probe raft.AppendEntriesResponse
	if err := trans.AppendEntries("n1", target, &raft.AppendEntriesRequest{RPCHeader: header, Term: term, PrevLogEntry: 1, PrevLogTerm: 1}, &probe); err != nil {
		t.Fatalf("probing %s: %v", addr, err)
	}
	// The term of the node's last entry is one of those it has known: the
	// node answers every try but the right one with a refusal.
	index := probe.LastLog + 1
	for prevTerm := uint64(1); prevTerm <= 8; prevTerm++ {
		req := &raft.AppendEntriesRequest{RPCHeader: header, Term: term, PrevLogEntry: probe.LastLog, PrevLogTerm: prevTerm,
			Entries:           []*raft.Log{{Index: index, Term: term, Type: raft.LogCommand, Data: data}},
			LeaderCommitIndex: index}
		var resp raft.AppendEntriesResponse
		if err := trans.AppendEntries("n1", target, req, &resp); err != nil {
			// The entry is committed by the append itself, and raft hands
			// it to the state machine before it answers: the node may
			// stop on it before the answer is written. The caller checks
			// that it stopped, on this entry.
			t.Logf("appending to %s: %v (the node may have stopped on the entry)", addr, err)
			return index
		}
		if resp.Success {
			return index
		}
	}
	t.Fatalf("%s took no forged entry after its last, %d", addr, probe.LastLog)
	return 0
}

// TestUnappliableEntryStopsTheNode runs a node of a cluster of one on
// loopback, makes it commit an entry of a kind no release wrote, and
// checks that it stops with one line naming the entry; that it then
// refuses to start with one line naming the entry and the fix, before
// raft runs; and that once "cluster recover --skip-entry" allowed the
// skip, it starts and serves.
func TestUnappliableEntryStopsTheNode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	raftAddr, err := testbin.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--dev", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--log-format", "text", "--data-dir", dir,
		"--node-id", "n1", "--raft-listen", raftAddr, "--peers", "n1=" + raftAddr}
	procs := proctest.Options{Timeout: time.Minute, Tail: 40}
	start := func() *proctest.Proc {
		return procs.StartSpec(t, proctest.Spec{Name: "n1", Path: os.Args[0], Args: args, Env: []string{runMainEnv + "=1"}})
	}

	n1 := start()
	n1.WaitFor("msg=leading")
	index := forgeEntry(t, raftAddr, "n1", []byte{0x7f, 0x00})
	if code := n1.WaitExit(); code != exitReplicaFailed {
		t.Fatalf("exit status %d after the forged entry, want %d", code, exitReplicaFailed)
	}
	line := n1.WaitFor("cannot apply a replicated entry")
	for _, want := range []string{fmt.Sprintf("index=%d", index), "--skip-entry"} {
		if !strings.Contains(line, want) {
			t.Errorf("the stop line %q lacks %q", line, want)
		}
	}

	code, stderr := runCommand(t, dir, args, nil)
	var named []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, fmt.Sprintf("entry %d ", index)) {
			named = append(named, l)
		}
	}
	if code != exitFailure || len(named) != 1 || !strings.HasPrefix(named[0], "coordinator: ") ||
		!strings.Contains(named[0], fmt.Sprintf("--skip-entry %d", index)) {
		t.Fatalf("restart: exit %d, stderr %q; want %d and one line naming entry %d and the fix", code, stderr, exitFailure, index)
	}
	if strings.Contains(stderr, "raft listening") {
		t.Error("raft ran on a node that stopped at an entry it cannot apply")
	}

	code, out := runCommand(t, dir, []string{"cluster", "recover", "--data-dir", dir, "--skip-entry", fmt.Sprint(index)}, nil)
	if code != 0 {
		t.Fatalf("cluster recover --skip-entry %d: exit %d, %q", index, code, out)
	}
	n1 = start()
	n1.WaitFor("applied a replicated entry as nothing", fmt.Sprintf("index=%d", index))
	n1.WaitFor("msg=leading")
}

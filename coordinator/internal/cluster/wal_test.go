package cluster_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
)

// TestLogReopensAfterTailTruncation keeps the raft log a node writes
// (raft-wal, as StartNode opens it) through what a follower does when a
// new leader's log disagrees with its own: raft deletes the log's tail and
// appends the leader's entries, and the process is then killed (here a
// child process that exits without closing the log). The log must open
// again with every entry readable: a node restarted on its data directory
// rejoins without a manual step. raft-wal v0.4.0 sealed the truncated
// segment without its index, and raft.NewRaft then panicked on start with
// "sealed segment has no index block".
func TestLogReopensAfterTailTruncation(t *testing.T) {
	if dir := os.Getenv(walChildEnv); dir != "" {
		truncateTailAndDie(dir)
	}
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLogReopensAfterTailTruncation$")
	cmd.Env = append(os.Environ(), walChildEnv+"="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the process writing the log: %v\n%s", err, out)
	}

	w, err := wal.Open(dir)
	if err != nil {
		t.Fatalf("reopening the log: %v", err)
	}
	defer w.Close()
	for i := uint64(1); i <= 12; i++ {
		var l raft.Log
		if err := w.GetLog(i, &l); err != nil {
			t.Fatalf("GetLog(%d) after reopening: %v", i, err)
		}
		term := uint64(1)
		if i >= 10 {
			term = 2
		}
		if l.Term != term {
			t.Errorf("entry %d has term %d, want %d", i, l.Term, term)
		}
	}
	if last, err := w.LastIndex(); err != nil || last != 12 {
		t.Errorf("LastIndex = %d, %v; want 12", last, err)
	}
}

// walChildEnv names the directory the test's child process writes its log
// in.
const walChildEnv = "LEASEHOLD_REPLICA_WAL_CHILD"

// truncateTailAndDie is the child process: it writes entries 1 to 10 of
// term 1, deletes the last (never committed; a new leader's log replaces
// it), appends 10 to 12 of term 2 and exits without closing anything, as
// a SIGKILLed node does.
func truncateTailAndDie(dir string) {
	w, err := wal.Open(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	store := func(from, to, term uint64) {
		var logs []*raft.Log
		for i := from; i <= to; i++ {
			logs = append(logs, &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: fmt.Appendf(nil, "entry %d of term %d", i, term)})
		}
		if err := w.StoreLogs(logs); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	store(1, 10, 1)
	if err := w.DeleteRange(10, 10); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	store(10, 12, 2)
	os.Exit(0)
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/leasehold/leasehold/coordinator"
)

// errInconsistent is returned by runCheck when the check found problems:
// main exits 1 after the report.
var errInconsistent = errors.New("the database is inconsistent")

// runCheck runs "coordinator check [--data-dir DIR] [--artifact-store URL] [--json]": it verifies
// the database of a stopped coordinator (see coordinator.Check), prints
// what it found to stdout, and returns errInconsistent when it found a
// problem. Its flags, like the server's, can be set as LEASEHOLD_*
// variables: --data-dir defaults to LEASEHOLD_DATA_DIR, then ./data.
func runCheck(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("coordinator check", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "./data", "directory of the bbolt file to check")
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	store := fs.String("artifact-store", "", "the coordinator's --artifact-store, where the objects its pointers name are looked for "+
		"(empty: the directory beside the database); S3 credentials from the standard AWS environment and files")
	if _, err := parseWithEnv(fs, args, "coordinator check", stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, "\nChecks the database of a stopped coordinator: bbolt's consistency check, then that its\n"+
				"records agree (unfinished-job index, batches whole, counts, lease tokens), then that the artifact\n"+
				"store holds every object a job's pointer names. Read-only.\n"+
				"Exits 0 when consistent, 1 when a problem was found or the check could not run.\n")
		}
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	rep, err := coordinator.Check(ctx, *dataDir, *store)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "%s: schema %d, %d jobs (%d unfinished), %d batches, last token %d\n",
			rep.Path, rep.Schema, rep.Jobs, rep.Unfinished, rep.Batches, rep.LastToken)
		if rep.StoredPointers > 0 {
			fmt.Fprintf(stdout, "%d pointers to %d objects of the artifact store %s, %d missing\n",
				rep.StoredPointers, rep.Objects, rep.ArtifactStore, len(rep.MissingObjects))
		}
		for _, p := range rep.Problems {
			fmt.Fprintln(stdout, "problem:", p)
		}
		if rep.Omitted > 0 {
			fmt.Fprintf(stdout, "problem: %d more not listed\n", rep.Omitted)
		}
		if rep.OK() {
			fmt.Fprintln(stdout, "consistent")
		}
	}
	if !rep.OK() {
		return fmt.Errorf("%w: %d problems", errInconsistent, len(rep.Problems)+rep.Omitted)
	}
	return nil
}

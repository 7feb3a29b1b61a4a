package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/leasehold/leasehold/coordinator"
)

// errInconsistent is returned by runCheck when the check found problems:
// main exits 1 after the report.
var errInconsistent = errors.New("the database is inconsistent")

// runCheck runs "coordinator check [--data-dir DIR] [--json]": it verifies
// the database of a stopped coordinator (see coordinator.Check), prints
// what it found to stdout, and returns errInconsistent when it found a
// problem. Its flags, like the server's, can be set as LEASEHOLD_*
// variables: --data-dir defaults to LEASEHOLD_DATA_DIR, then ./data.
func runCheck(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("coordinator check", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "./data", "directory of the bbolt file to check")
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	if _, err := parseWithEnv(fs, args, "coordinator check", stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, "\nChecks the database of a stopped coordinator: bbolt's consistency check, then that its\n"+
				"records agree (unfinished-job index, batches whole, counts, lease tokens). Read-only.\n"+
				"Exits 0 when consistent, 1 when a problem was found or the check could not run.\n")
		}
		return err
	}
	rep, err := coordinator.Check(*dataDir)
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

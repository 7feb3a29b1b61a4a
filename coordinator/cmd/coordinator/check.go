package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/leasehold/leasehold/coordinator"
)

// errInconsistent is returned by runCheck when the check found problems:
// main exits 1 after the report.
var errInconsistent = errors.New("the database is inconsistent")

// runCheck runs "coordinator check [--data-dir DIR] [--json]": it verifies
// the database of a stopped coordinator (see coordinator.Check), prints
// what it found to stdout, and returns errInconsistent when it found a
// problem. --data-dir defaults to LEASEHOLD_DATA_DIR, then ./data, as for
// serving.
func runCheck(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("coordinator check", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dataDir := "./data"
	if v, ok := os.LookupEnv(envName("data-dir")); ok {
		dataDir = v
	}
	fs.StringVar(&dataDir, "data-dir", dataDir, "directory of the bbolt file to check (env "+envName("data-dir")+")")
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, "Usage of coordinator check:\n"+
				"Checks the database of a stopped coordinator: bbolt's consistency check, then that its\n"+
				"records agree (unfinished-job index, batches whole, counts, lease tokens). Read-only.\n"+
				"Exits 0 when consistent, 1 when a problem was found or the check could not run.\n")
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return err
		}
		return &usageError{msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return usagef("check: unexpected arguments: %v", fs.Args())
	}
	rep, err := coordinator.Check(dataDir)
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

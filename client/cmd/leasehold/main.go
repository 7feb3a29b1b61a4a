// Command leasehold is the command-line client of the Leasehold preview
// coordinator: submit documents, follow and cancel jobs, download previews,
// and, for operators, replay failed jobs and control dispatch. Run
// "leasehold help" for the commands.
package main

import (
	"os"

	"github.com/leasehold/leasehold/client/internal/cli"
	"github.com/leasehold/leasehold/internal/fdlimit"
)

func main() {
	// The CLI holds a connection or a few; it raises its limit as the
	// coordinator and the renderer do, so that the three start alike.
	_, _ = fdlimit.Raise()
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

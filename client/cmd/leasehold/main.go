// Command leasehold is the command-line client of the Leasehold preview
// coordinator: submit documents, follow and cancel jobs, download previews,
// and, for operators, replay failed jobs and control dispatch. Run
// "leasehold help" for the commands.
package main

import (
	"os"

	"github.com/leasehold/leasehold/client/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

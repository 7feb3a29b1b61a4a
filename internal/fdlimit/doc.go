// Package fdlimit raises a process's limit on open file descriptors to
// the most it may have, for the coordinator, the renderer and the CLI.
//
// Every connection costs a descriptor, so the soft limit bounds how many
// connections a process can hold whatever its own caps say: under a
// soft limit of 1,024 a coordinator whose listeners may hold more stops
// accepting with "too many open files". The Go runtime raises the soft
// limit to one below the hard limit when a program starts (and lowers it
// again for the processes it starts); Raise sets it to the hard limit
// itself, so that the limit in force does not rest on a runtime detail,
// and returns both, for the coordinator to log and to check against its
// caps. A hard limit below the caps can only be raised by whoever starts
// the process (ulimit -Hn, systemd's LimitNOFILE, the container runtime).
package fdlimit

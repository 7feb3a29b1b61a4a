package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/coordinator"
	"github.com/leasehold/leasehold/coordinator/internal/cluster"
	"github.com/leasehold/leasehold/coordinator/internal/server"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/security"
)

// clusterUsage lists the cluster subcommands.
const clusterUsage = `Usage: coordinator cluster SUBCOMMAND [flags]

Against a running node, over gRPC with an operator token of scope "*"
(--addr, --token or LEASEHOLD_TOKEN, and the TLS flags, as the leasehold CLI):
  status            the members, the leader, each member's replication lag
  transfer-leader   hand leadership to another voter (--to ID, or the most up to date)
  add               add a voter (--id, --raft-addr); needs the backup role as well
  remove            remove a member (--id)

On the data directory of a stopped node:
  recover           make it a member of a cluster of --peers alone, after the quorum was lost;
                    or, with --skip-entry alone, let it apply as nothing an entry it cannot apply

Each takes --help.
`

// clusterCommands are the cluster subcommands against a running node.
var clusterCommands = map[string]func(r *remote, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error{
	"status":          clusterStatus,
	"transfer-leader": clusterTransfer,
	"add":             clusterAdd,
	"remove":          clusterRemove,
}

// runCluster runs "coordinator cluster SUBCOMMAND ...".
func runCluster(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, clusterUsage)
		return usagef("coordinator cluster needs a subcommand: status, transfer-leader, add, remove or recover")
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stderr, clusterUsage)
		return flag.ErrHelp
	case "recover":
		return clusterRecover(rest, stdout, stderr)
	}
	sub, ok := clusterCommands[name]
	if !ok {
		return usagef("coordinator cluster: unknown subcommand %q (status, transfer-leader, add, remove, recover)", name)
	}
	fs := flag.NewFlagSet("coordinator cluster "+name, flag.ContinueOnError)
	r := &remote{}
	r.register(fs)
	return sub(r, fs, rest, stdout, stderr)
}

// remote holds the connection flags of the subcommands that call a
// running node, named as the leasehold CLI names them, with the same
// LEASEHOLD_* variables.
type remote struct {
	addr, token                           string
	tls                                   bool
	tlsCA, tlsCert, tlsKey, tlsServerName string
	insecurePlaintext                     bool
	timeout                               time.Duration
}

func (r *remote) register(fs *flag.FlagSet) {
	fs.StringVar(&r.addr, "addr", "127.0.0.1:7070", "gRPC address of a node (the changes must reach the leader)")
	fs.StringVar(&r.token, "token", "", "bearer token of an operator whose scope is \"*\"")
	fs.DurationVar(&r.timeout, "timeout", 30*time.Second, "how long the call may take")
	fs.BoolVar(&r.tls, "tls", false, "connect over TLS; implied by the other --tls-* flags")
	fs.StringVar(&r.tlsCA, "tls-ca", "", "PEM CA certificates that verify the node; default the system's")
	fs.StringVar(&r.tlsCert, "tls-cert", "", "PEM client certificate, for mutual TLS")
	fs.StringVar(&r.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&r.tlsServerName, "tls-server-name", "", "`name` the node's certificate must carry, if not the host of --addr")
	fs.BoolVar(&r.insecurePlaintext, "insecure-plaintext", false, "send the token without TLS to a node not on loopback, where the network itself encrypts")
}

// dial parses the flags (with their LEASEHOLD_* defaults), checks them
// and connects: the call's context, the client and what to close.
func (r *remote) dial(fs *flag.FlagSet, args []string, stderr io.Writer) (context.Context, *client.Client, func(), error) {
	if _, err := parseWithEnv(fs, args, fs.Name(), stderr); err != nil {
		return nil, nil, nil, err
	}
	tlsOn := r.tls || r.tlsCA != "" || r.tlsCert != "" || r.tlsKey != "" || r.tlsServerName != ""
	switch {
	case r.token == "":
		return nil, nil, nil, usagef("%s needs a token: --token or LEASEHOLD_TOKEN", fs.Name())
	case r.timeout <= 0:
		return nil, nil, nil, usagef("--timeout=%v: want a positive duration", r.timeout)
	case tlsOn && r.insecurePlaintext:
		return nil, nil, nil, usagef("--insecure-plaintext excludes --tls and the --tls-* flags")
	case (r.tlsCert == "") != (r.tlsKey == ""):
		return nil, nil, nil, usagef("--tls-cert and --tls-key go together: give both or neither")
	}
	opts := []client.Option{client.WithToken(r.token)}
	switch {
	case tlsOn:
		cfg, err := security.ClientTLS(r.tlsCA, r.tlsCert, r.tlsKey, r.tlsServerName)
		if err != nil {
			return nil, nil, nil, usagef("TLS: %v", err)
		}
		opts = append(opts, client.WithTLS(cfg))
	case r.insecurePlaintext:
		opts = append(opts, client.WithInsecurePlaintext())
	}
	c, err := client.Dial(r.addr, opts...)
	if errors.Is(err, client.ErrPlaintextToken) {
		return nil, nil, nil, usagef("%v (pass --tls-ca or --tls, or --insecure-plaintext)", err)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	return ctx, c, func() { cancel(); c.Close() }, nil
}

// clusterStatus runs "coordinator cluster status": a line on the cluster,
// then a table of the members.
func clusterStatus(r *remote, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	asJSON := fs.Bool("json", false, "print the answer as one JSON object")
	ctx, c, done, err := r.dial(fs, args, stderr)
	if err != nil {
		return err
	}
	defer done()
	resp, err := c.GetCluster(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(resp)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, string(b))
		return err
	}
	writeClusterStatus(stdout, resp)
	return nil
}

// writeClusterStatus writes a GetCluster answer as clusterStatus prints it.
func writeClusterStatus(w io.Writer, resp *leaseholdv1.GetClusterResponse) {
	if !resp.GetReplicated() {
		fmt.Fprintln(w, "single node: this coordinator runs without a cluster")
		return
	}
	leader := resp.GetLeaderId()
	if leader == "" {
		leader = "none known"
	}
	view := "as the leader sees it"
	if !resp.GetFromLeader() {
		view = "as follower " + resp.GetNodeId() + " sees it; ask the leader for every member's lag"
	}
	fmt.Fprintf(w, "cluster: leader %s, term %d, commit index %d, applied %d (%s)\n", leader, resp.GetTerm(),
		resp.GetCommitIndex(), resp.GetAppliedIndex(), view)
	t := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(t, "ID\tSUFFRAGE\tROLE\tRAFT ADDRESS\tGRPC ADDRESS\tMATCH\tLAG\tLAST CONTACT")
	for _, m := range resp.GetMembers() {
		role := "follower"
		if m.GetLeader() {
			role = "leader"
		}
		match, lag, contact := "-", "-", "-"
		if p := m.GetProgress(); p != nil {
			match, lag = fmt.Sprint(p.GetMatchIndex()), fmt.Sprint(p.GetLagEntries())
			if lc := p.GetLastContact(); lc != nil {
				contact = lc.AsDuration().Round(time.Millisecond).String() + " ago"
			}
		} else if resp.GetFromLeader() && !m.GetLeader() {
			contact = "not since this leader began"
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.GetId(), suffrageName(m.GetSuffrage()), role, m.GetRaftAddress(),
			orDash(m.GetGrpcAddress()), match, lag, contact)
	}
	t.Flush()
}

// suffrageName is a suffrage as the table writes it.
func suffrageName(s leaseholdv1.Suffrage) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "SUFFRAGE_"))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// reasonFlag registers the --reason every change needs.
func reasonFlag(fs *flag.FlagSet) *string {
	return fs.String("reason", "", "why (required); written to the audit trail")
}

// clusterTransfer runs "coordinator cluster transfer-leader".
func clusterTransfer(r *remote, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	to := fs.String("to", "", "the voter to hand leadership to (default: the one that has replicated the most)")
	reason := reasonFlag(fs)
	ctx, c, done, err := r.dial(fs, args, stderr)
	if err != nil {
		return err
	}
	defer done()
	resp, err := c.TransferLeadership(ctx, *to, *reason)
	if err != nil {
		return err
	}
	if !resp.GetChanged() {
		fmt.Fprintf(stdout, "%s leads already: nothing changed\n", resp.GetLeaderId())
		return nil
	}
	fmt.Fprintf(stdout, "leadership moved from %s to %s (term %d)\n", resp.GetPreviousLeaderId(), resp.GetLeaderId(), resp.GetTerm())
	return nil
}

// clusterAdd runs "coordinator cluster add".
func clusterAdd(r *remote, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	id := fs.String("id", "", "the new member's --node-id (required)")
	raftAddr := fs.String("raft-addr", "", "the address its raft listener is reached at, host:port (required)")
	force := fs.Bool("force", false, "add it even when fewer than a majority of the voters would answer the leader (QUORUM_AT_RISK)")
	reason := reasonFlag(fs)
	ctx, c, done, err := r.dial(fs, args, stderr)
	if err != nil {
		return err
	}
	defer done()
	resp, err := c.AddVoter(ctx, &leaseholdv1.AddVoterRequest{Id: *id, RaftAddress: *raftAddr, Reason: *reason, Force: *force})
	if err != nil {
		return err
	}
	if !resp.GetChanged() {
		fmt.Fprintf(stdout, "%s is a voter at %s already: nothing changed\n", *id, *raftAddr)
		return nil
	}
	fmt.Fprintf(stdout, "added %s at %s as a voter (configuration at log index %d)\n", *id, *raftAddr, resp.GetConfigurationIndex())
	return nil
}

// clusterRemove runs "coordinator cluster remove".
func clusterRemove(r *remote, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	id := fs.String("id", "", "the member's node id (required)")
	force := fs.Bool("force", false, "remove it even when fewer than a majority of the voters left would answer the leader (QUORUM_AT_RISK)")
	reason := reasonFlag(fs)
	ctx, c, done, err := r.dial(fs, args, stderr)
	if err != nil {
		return err
	}
	defer done()
	resp, err := c.RemoveServer(ctx, &leaseholdv1.RemoveServerRequest{Id: *id, Reason: *reason, Force: *force})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "removed %s (configuration at log index %d); stop it, or add it again\n", *id, resp.GetConfigurationIndex())
	return nil
}

// clusterRecover runs "coordinator cluster recover --data-dir DIR
// --node-id ID --peers ... [--skip-entry INDEX]": see
// coordinator.RecoverCluster; or, with --skip-entry alone, allows the
// stopped node to skip entries it cannot apply (coordinator.SkipEntries).
func clusterRecover(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("coordinator cluster recover", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "./data", "data directory of the stopped node; no coordinator may be running on it")
	nodeID := fs.String("node-id", "", "the node's id (required to recover a lost quorum)")
	peers := fs.String("peers", "", "the new configuration, the same for every surviving node: id=raft_address[/grpc_address],... (required to recover a lost quorum)")
	var skip indexList
	fs.Var(&skip, "skip-entry", "the `index` of a committed entry the node cannot apply, to apply as nothing (repeat it or separate indexes with commas); "+
		"alone, it changes no raft state; give every node the same")
	source, err := parseWithEnv(fs, args, "coordinator cluster recover", stderr)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stderr, "\nFor a cluster that lost its quorum for good. Run it on every surviving node, stopped, with the same --peers\n"+
			"(the survivors), then start them with those --peers: the one holding the most of the log is elected.\n"+
			"Entries a node holds are kept even if they were never committed. With --skip-entry alone, for a node that\n"+
			"stopped at an entry it cannot apply. See docs/runbooks/cluster-operations.md.\n")
	}
	if err != nil {
		return err
	}
	switch {
	case strings.TrimSpace(*dataDir) == "":
		return usagef("%s=\"\": want a directory", source["data-dir"])
	case len(skip) > 0 && *nodeID == "" && *peers == "":
		return skipEntries(*dataDir, skip, stdout)
	case *nodeID == "":
		return usagef("--node-id is required: the id of the node whose directory this is")
	case *peers == "":
		return usagef("--peers is required: the voters of the recovered cluster")
	}
	list, err := cluster.ParsePeers(*peers)
	if err != nil {
		return usagef("%s=%q: %v", source["peers"], *peers, err)
	}
	if err := checkPeers(list, *nodeID, source); err != nil {
		return err
	}
	res, err := coordinator.RecoverCluster(*dataDir, *nodeID, list, skip)
	if err != nil {
		return err
	}
	var ids []string
	for _, p := range list {
		ids = append(ids, p.ID)
	}
	fmt.Fprintf(stdout, "recovered %s in %s: a cluster of %d voters (%s), from log index %d of term %d\n", *nodeID, res.RaftDir,
		res.Voters, strings.Join(ids, ", "), res.LastIndex, res.LastTerm)
	fmt.Fprintf(stdout, "start it with --peers %s\n", *peers)
	return nil
}

// skipEntries runs "coordinator cluster recover --skip-entry INDEX"
// without a new configuration.
func skipEntries(dataDir string, skip indexList, stdout io.Writer) error {
	res, err := coordinator.SkipEntries(dataDir, skip)
	if err != nil {
		return err
	}
	stopped := "it had not stopped at an entry"
	if res.Halted != 0 {
		stopped = fmt.Sprintf("it had stopped at entry %d", res.Halted)
	}
	fmt.Fprintf(stdout, "the node of %s applied the log up to entry %d and %s; it will apply entry %s as nothing if it cannot apply it: start it\n",
		dataDir, res.Applied, stopped, skip.String())
	return nil
}

// indexList is a flag of log indexes, repeatable and comma-separated.
type indexList []uint64

// String implements flag.Value.
func (l *indexList) String() string {
	var s []string
	for _, i := range *l {
		s = append(s, strconv.FormatUint(i, 10))
	}
	return strings.Join(s, ",")
}

// Set implements flag.Value: it adds each comma-separated index.
func (l *indexList) Set(s string) error {
	for _, f := range strings.Split(s, ",") {
		i, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil || i == 0 {
			return fmt.Errorf("%q is not a log index (a positive number)", f)
		}
		*l = append(*l, i)
	}
	return nil
}

// checkPeers checks the ids and addresses of a peers list, and that it
// holds nodeID.
func checkPeers(peers []cluster.Peer, nodeID string, source map[string]string) error {
	self := false
	for _, p := range peers {
		if err := server.CheckMemberID(p.ID); err != nil {
			return usagef("%s: peer %q: %v", source["peers"], p.ID, err)
		}
		if !hostPort(p.RaftAddr) || (p.GRPCAddr != "" && !hostPort(p.GRPCAddr)) {
			return usagef("%s: peer %s: want id=host:port or id=host:port/host:port", source["peers"], p.ID)
		}
		self = self || p.ID == nodeID
	}
	if !self {
		return usagef("%s=%q is not one of %s", source["node-id"], nodeID, source["peers"])
	}
	return nil
}

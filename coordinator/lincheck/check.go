package lincheck

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc/codes"
)

// Operations turns records into porcupine operations, one job each: a
// Submit becomes one operation per job it created, an answered Acquire one
// per lease it granted, and a Pending Acquire one in each partition that
// may need it (see the package documentation). Records that name no job
// (an Acquire that granted nothing, a Submit that was refused) are left
// out; CheckHistory looks at those. A Pending record returns at Never,
// whatever its Return says.
func Operations(records []Record) []porcupine.Operation {
	var ops []porcupine.Operation
	add := func(r Record, in Input, out Output) {
		ret := r.Return
		if r.Pending {
			// It may take effect at any time after its call, also after
			// the client gave up on it.
			ret = Never
		}
		ops = append(ops, porcupine.Operation{
			ClientId: r.Client, Input: in, Call: r.Call, Output: out, Return: ret,
		})
	}
	submitted := map[string]bool{}
	unresolved := Never // earliest call of a Pending Submit whose jobs are unknown
	for _, r := range records {
		if r.Kind == Submit {
			for _, id := range r.JobIDs {
				submitted[id] = true
			}
			if r.Pending && len(r.JobIDs) == 0 {
				unresolved = min(unresolved, r.Call)
			}
		}
	}
	seen := map[string]bool{}
	for _, r := range records {
		if r.Stale {
			continue
		}
		out := Output{Pending: r.Pending, Code: r.Code, Reason: r.Reason, Err: r.Err, Replayed: r.Replayed,
			AlreadyCancelled: r.AlreadyCancelled, RunningRenderer: r.RunningRenderer, View: r.View}
		switch r.Kind {
		case Submit:
			for i, id := range r.JobIDs {
				add(r, Input{Kind: Submit, Job: id, Unsupported: i < len(r.Unsupported) && r.Unsupported[i]}, out)
				seen[id] = true
			}
		case Acquire:
			if r.Pending || r.Code != codes.OK {
				continue
			}
			for _, g := range r.Grants {
				o := out
				o.Grant = g
				add(r, Input{Kind: Acquire, Job: g.Job, Renderer: r.Renderer}, o)
				seen[g.Job] = true
			}
		default:
			add(r, Input{Kind: r.Kind, Job: r.Job, Renderer: r.Renderer, Token: r.Token, Outcome: r.Outcome, Foreign: r.Foreign, Node: r.Node}, out)
			seen[r.Job] = true
		}
	}
	// A job no Submit answered for can only come from a Submit whose
	// answer was lost and never learnt: let that one have created it.
	if unresolved != Never {
		for id := range seen {
			if !submitted[id] {
				ops = append(ops, porcupine.Operation{
					ClientId: 0, Input: Input{Kind: Submit, Job: id}, Call: unresolved,
					Output: Output{Pending: true, Err: "a submission whose answer was lost"}, Return: Never,
				})
			}
		}
	}
	return append(ops, lostAcquires(records)...)
}

// lostAcquires places each Pending Acquire in the partitions of the jobs
// whose answers show a lease of its renderer under a token that no
// answered Acquire granted it.
func lostAcquires(records []Record) []porcupine.Operation {
	pending := map[string][]Record{} // by renderer
	for _, r := range records {
		if r.Kind == Acquire && r.Pending {
			pending[r.Renderer] = append(pending[r.Renderer], r)
		}
	}
	if len(pending) == 0 {
		return nil
	}
	known := map[Grant]bool{} // job, token and renderer of answered grants
	for _, r := range records {
		if r.Kind == Acquire && !r.Pending {
			for _, g := range r.Grants {
				known[Grant{Job: g.Job, Token: g.Token, Renderer: g.Renderer}] = true
			}
		}
	}
	type key struct {
		job, renderer string
	}
	latest := map[key]int64{} // the last return of an answer that shows an unknown lease
	note := func(job, renderer string, token uint64, at int64) {
		if renderer == "" || known[Grant{Job: job, Token: token, Renderer: renderer}] {
			return
		}
		k := key{job, renderer}
		latest[k] = max(latest[k], at)
	}
	for _, r := range records {
		if r.Stale {
			continue
		}
		if v := r.View; v != nil {
			note(r.Job, v.LeaseRenderer, v.LeaseToken, r.Return)
			note(r.Job, v.CancelRenderer, v.RevokedToken, r.Return)
		}
		if r.Kind == Cancel && r.RunningRenderer != "" && r.View != nil {
			note(r.Job, r.RunningRenderer, r.View.RevokedToken, r.Return)
		}
	}
	var ops []porcupine.Operation
	for k, at := range latest {
		for _, r := range pending[k.renderer] {
			if r.Call <= at {
				ops = append(ops, porcupine.Operation{
					ClientId: r.Client, Input: Input{Kind: Acquire, Job: k.job, Renderer: r.Renderer},
					Call: r.Call, Output: Output{Pending: true, Err: r.Err}, Return: Never,
				})
			}
		}
	}
	return ops
}

// CheckHistory checks what porcupine's per-job partitions cannot see:
// fencing tokens are never granted twice, a grant answered before another
// grant was asked for has the smaller token, and no Acquire was refused
// (but for NOT_LEADER, which grants nothing).
func CheckHistory(records []Record) error {
	type grant struct {
		Grant
		call, ret int64
	}
	var grants []grant
	var errs []string
	for _, r := range records {
		if r.Kind != Acquire || r.Pending || r.Refused() {
			continue
		}
		if r.Code != codes.OK {
			errs = append(errs, fmt.Sprintf("Acquire by %s refused: %s %s: %s", r.Renderer, r.Code, r.Reason, r.Err))
			continue
		}
		for _, g := range r.Grants {
			grants = append(grants, grant{g, r.Call, r.Return})
		}
	}
	byToken := map[uint64]grant{}
	for _, g := range grants {
		if prev, dup := byToken[g.Token]; dup {
			errs = append(errs, fmt.Sprintf("token %d granted twice: job %s to %s and job %s to %s", g.Token, prev.Job, prev.Renderer, g.Job, g.Renderer))
		}
		byToken[g.Token] = g
	}
	byReturn := append([]grant(nil), grants...)
	sort.Slice(byReturn, func(i, j int) bool { return byReturn[i].ret < byReturn[j].ret })
	byCall := append([]grant(nil), grants...)
	sort.Slice(byCall, func(i, j int) bool { return byCall[i].call < byCall[j].call })
	var top grant // the largest token of the grants answered so far
	i := 0
	for _, g := range byCall {
		for ; i < len(byReturn) && byReturn[i].ret < g.call; i++ {
			if byReturn[i].Token > top.Token {
				top = byReturn[i]
			}
		}
		if top.Token != 0 && g.Token <= top.Token {
			errs = append(errs, fmt.Sprintf("token %d (job %s, asked at %d ns) is not larger than token %d (job %s, answered at %d ns)",
				g.Token, g.Job, g.call, top.Token, top.Job, top.ret))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	if len(errs) > 10 {
		errs = append(errs[:10], fmt.Sprintf("... and %d more", len(errs)-10))
	}
	return errors.New(strings.Join(errs, "\n"))
}

// CheckStaleReads checks the stale reads of records, which the model
// leaves out: a stale read may show any earlier state of a job, so it is
// checked only for showing nothing from the future. Everything it shows
// must have been asked for by a call sent before the read returned: the
// job by its Submit, a lease by the Acquire that was answered with its
// token, a success by a Complete with that token and digest, a
// cancellation by a Cancel. A lease under a token no answered Acquire
// granted (its answer was lost) is not checked.
func CheckStaleReads(records []Record) error {
	type key struct {
		job   string
		token uint64
	}
	submitted := map[string]int64{} // job: the earliest call of a Submit that names it
	granted := map[key]int64{}      // job and token: the call of the Acquire that granted it
	successes := map[key][]Record{} // job and token: the successful completions sent
	cancels := map[string]int64{}   // job: the earliest call of a Cancel of its team
	earliest := func(m map[string]int64, job string, at int64) {
		if prev, ok := m[job]; !ok || at < prev {
			m[job] = at
		}
	}
	for _, r := range records {
		switch r.Kind {
		case Submit:
			for _, id := range r.JobIDs {
				earliest(submitted, id, r.Call)
			}
		case Acquire:
			for _, g := range r.Grants {
				granted[key{g.Job, g.Token}] = r.Call
			}
		case Complete:
			if r.Outcome.Success {
				k := key{r.Job, r.Token}
				successes[k] = append(successes[k], r)
			}
		case Cancel:
			if !r.Foreign {
				earliest(cancels, r.Job, r.Call)
			}
		}
	}
	var errs []string
	for _, r := range records {
		v := r.View
		if !r.Stale || r.Pending || v == nil {
			continue
		}
		at := fmt.Sprintf("stale read of job %s from node %d (applied index %d, answered at %d ns) shows %s", r.Job, r.Node, r.AppliedIndex, r.Return, v)
		if call, ok := submitted[r.Job]; !ok || call > r.Return {
			errs = append(errs, at+": no Submit naming the job was sent before")
			continue
		}
		if v.LeaseToken != 0 {
			if call, ok := granted[key{r.Job, v.LeaseToken}]; ok && call > r.Return {
				errs = append(errs, at+fmt.Sprintf(": the Acquire that granted token %d was sent after it", v.LeaseToken))
			}
		}
		if v.Phase == succeeded {
			ok := false
			for _, c := range successes[key{r.Job, v.ArtifactToken}] {
				ok = ok || c.Outcome.Digest == v.ArtifactDigest && c.Call < r.Return
			}
			if !ok {
				errs = append(errs, at+": no Complete with that artifact was sent before")
			}
		}
		if v.Phase == cancelled {
			if call, ok := cancels[r.Job]; !ok || call > r.Return {
				errs = append(errs, at+": no Cancel of the job was sent before")
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	if len(errs) > 10 {
		errs = append(errs[:10], fmt.Sprintf("... and %d more", len(errs)-10))
	}
	return errors.New(strings.Join(errs, "\n"))
}

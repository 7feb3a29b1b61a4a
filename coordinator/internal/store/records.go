package store

import (
	"fmt"
	"strings"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"google.golang.org/protobuf/proto"
)

// PutRejection appends a rejected completion and returns it with its id.
func (t *Tx) PutRejection(r jobs.Rejection) (jobs.Rejection, error) {
	id, err := t.nextSequence(bucketRejections)
	if err != nil {
		return r, err
	}
	r.ID = id
	v, err := proto.Marshal(rejectionToRecord(r))
	if err != nil {
		return r, err
	}
	return r, t.put(bucketRejections, itob(id), v)
}

// ForEachRejection calls fn for rejections newest first, starting below
// before (0 for the newest), until fn returns false or an error.
func (t *Tx) ForEachRejection(before uint64, fn func(jobs.Rejection) (bool, error)) error {
	return reverse(t.tx.Bucket(bucketRejections).Cursor(), before, func(k, v []byte) (bool, error) {
		var r storagev1.RejectionRecord
		if err := proto.Unmarshal(v, &r); err != nil {
			return false, fmt.Errorf("decoding rejection %d: %w", btoi(k), err)
		}
		return fn(rejectionFromRecord(&r))
	})
}

// PutAudit appends an audit record (or rewrites the one with a.ID when
// set) and returns it with its id. A replay with a request id is indexed
// so that ReplayByRequest finds it again.
func (t *Tx) PutAudit(a jobs.AuditRecord) (jobs.AuditRecord, error) {
	id := a.ID
	if id == 0 {
		var err error
		if id, err = t.nextSequence(bucketAudit); err != nil {
			return a, err
		}
	}
	a.ID = id
	v, err := proto.Marshal(auditToRecord(a))
	if err != nil {
		return a, err
	}
	if err := t.put(bucketAudit, itob(id), v); err != nil {
		return a, err
	}
	if a.Action == jobs.AuditReplay && a.RequestID != "" {
		return a, t.put(bucketReplays, replayKey(a.Principal, a.RequestID), itob(id))
	}
	return a, nil
}

// replayKey scopes a replay's request id to the principal that made it, so
// one operator's id never answers another's call.
func replayKey(principal, requestID string) []byte {
	return []byte(principal + "\x00" + requestID)
}

// ReplayByRequest finds the audit record of principal's replay with requestID.
func (t *Tx) ReplayByRequest(principal, requestID string) (jobs.AuditRecord, bool, error) {
	v := t.tx.Bucket(bucketReplays).Get(replayKey(principal, requestID))
	if v == nil {
		return jobs.AuditRecord{}, false, nil
	}
	raw := t.tx.Bucket(bucketAudit).Get(v)
	if raw == nil {
		return jobs.AuditRecord{}, false, fmt.Errorf("audit record %d indexed but missing", btoi(v))
	}
	var r storagev1.AuditRecord
	if err := proto.Unmarshal(raw, &r); err != nil {
		return jobs.AuditRecord{}, false, err
	}
	return auditFromRecord(&r), true, nil
}

// ForEachAudit calls fn for audit records newest first, starting below
// before (0 for the newest), until fn returns false or an error.
func (t *Tx) ForEachAudit(before uint64, fn func(jobs.AuditRecord) (bool, error)) error {
	return reverse(t.tx.Bucket(bucketAudit).Cursor(), before, func(k, v []byte) (bool, error) {
		var r storagev1.AuditRecord
		if err := proto.Unmarshal(v, &r); err != nil {
			return false, fmt.Errorf("decoding audit %d: %w", btoi(k), err)
		}
		return fn(auditFromRecord(&r))
	})
}

// PutDispatchState persists the dispatch switch.
func (t *Tx) PutDispatchState(s jobs.DispatchState) error {
	v, err := proto.Marshal(&storagev1.DispatchState{Paused: s.Paused, Since: ns(s.Since), Principal: s.Principal, Reason: s.Reason})
	if err != nil {
		return err
	}
	return t.put(bucketMeta, keyDispatch, v)
}

// DispatchState reads the dispatch switch (zero: running).
func (t *Tx) DispatchState() (jobs.DispatchState, error) {
	v := t.tx.Bucket(bucketMeta).Get(keyDispatch)
	if v == nil {
		return jobs.DispatchState{}, nil
	}
	var r storagev1.DispatchState
	if err := proto.Unmarshal(v, &r); err != nil {
		return jobs.DispatchState{}, err
	}
	return jobs.DispatchState{Paused: r.Paused, Since: tm(r.Since), Principal: r.Principal, Reason: r.Reason}, nil
}

type cursor interface {
	Last() ([]byte, []byte)
	Seek([]byte) ([]byte, []byte)
	Prev() ([]byte, []byte)
}

// reverse walks c from the key below before (or the last key) backwards.
func reverse(c cursor, before uint64, fn func(k, v []byte) (bool, error)) error {
	var k, v []byte
	if before == 0 {
		k, v = c.Last()
	} else {
		k, v = c.Seek(itob(before))
		if k == nil {
			k, v = c.Last()
		}
		for k != nil && btoi(k) >= before {
			k, v = c.Prev()
		}
	}
	for ; k != nil; k, v = c.Prev() {
		more, err := fn(k, v)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// PutLeader records the leader of a replicated coordinator, as it announces
// itself on taking over: followers read it to name the leader's gRPC
// address.
func (t *Tx) PutLeader(id, addr string) error {
	return t.put(bucketMeta, keyLeader, []byte(id+"\x00"+addr))
}

// Leader returns the last leader announced, or empty strings.
func (t *Tx) Leader() (id, addr string) {
	v := t.tx.Bucket(bucketMeta).Get(keyLeader)
	if v == nil {
		return "", ""
	}
	id, addr, _ = strings.Cut(string(v), "\x00")
	return id, addr
}

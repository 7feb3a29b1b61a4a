package auth

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestParse checks the principals file format and its validation.
func TestParse(t *testing.T) {
	t.Parallel()

	t.Run("A valid file maps tokens to principals with team and scope", func(t *testing.T) {
		t.Parallel()
		s, err := Parse([]byte(`{"principals":[
			{"name":"alpha-svc","token":"alpha-secret","team":"alpha","roles":["submitter"]},
			{"name":"ops","token":"ops-secret","roles":["operator"],"scope":["alpha","beta"]},
			{"name":"pool","token":"pool-secret","roles":["renderer"]}]}`))
		if err != nil {
			t.Fatalf("Parse: %v", err)
		}
		if got, want := s.Len(), 3; got != want {
			t.Fatalf("Len = %d, want %d", got, want)
		}
		got, ok := s.Lookup("ops-secret")
		if !ok {
			t.Fatalf("Lookup(ops-secret) found nothing")
		}
		want := Principal{Name: "ops", Scope: []string{"alpha", "beta"}, Roles: []Role{RoleOperator}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("principal (-want +got):\n%s", diff)
		}
		if _, ok := s.Lookup("ops-secreT"); ok {
			t.Errorf("Lookup of a near-miss token found a principal")
		}
	})

	bad := []struct {
		name, json, wantErr string
	}{
		{"An empty list is refused", `{"principals":[]}`, "no principals"},
		{"An unknown field is refused", `{"principals":[{"name":"a","token":"12345678","roles":["renderer"],"teams":["x"]}]}`, "unknown field"},
		{"A short token is refused", `{"principals":[{"name":"a","token":"short","roles":["renderer"]}]}`, "at least 8 bytes"},
		{"A repeated token is refused", `{"principals":[{"name":"a","token":"12345678","roles":["renderer"]},{"name":"b","token":"12345678","roles":["renderer"]}]}`, "token repeats"},
		{"A repeated name is refused", `{"principals":[{"name":"a","token":"12345678","roles":["renderer"]},{"name":"a","token":"87654321","roles":["renderer"]}]}`, "name repeats"},
		{"An unknown role is refused", `{"principals":[{"name":"a","token":"12345678","roles":["admin"]}]}`, "unknown role"},
		{"A submitter without a team is refused", `{"principals":[{"name":"a","token":"12345678","roles":["submitter"]}]}`, "needs a team"},
		{"An operator without a scope is refused", `{"principals":[{"name":"a","token":"12345678","roles":["operator"]}]}`, "needs a scope"},
		{"A submitter for every team is refused", `{"principals":[{"name":"a","token":"12345678","team":"*","roles":["submitter"]}]}`, "one team"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tc.json))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Parse error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestLoadFile checks that a file on disk is read and parsed.
func TestLoadFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "principals.json")
	if err := os.WriteFile(path, []byte(`{"principals":[{"name":"pool","token":"pool-secret","roles":["renderer"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := LoadFile(path)
	if err != nil {
		t.Fatalf("LoadFile: %v", err)
	}
	p, ok := s.Lookup("pool-secret")
	if !ok || !p.Can(RoleRenderer) {
		t.Errorf("Lookup(pool-secret) = %+v, %v; want a renderer", p, ok)
	}
	if _, err := LoadFile(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Errorf("LoadFile of a missing file succeeded")
	}
}

// TestPrincipalScope checks Can, SubmitterOf and InScope for the
// development principals.
func TestPrincipalScope(t *testing.T) {
	t.Parallel()
	s := DevPrincipals()
	tests := []struct {
		token         string
		role          Role
		team          string
		wantCan       bool
		wantSubmitter bool
		wantScope     bool
	}{
		{DevAlphaToken, RoleSubmitter, "alpha", true, true, false},
		{DevAlphaToken, RoleOperator, "beta", false, false, false},
		{DevBetaToken, RoleSubmitter, "alpha", true, false, false},
		{DevRendererToken, RoleRenderer, "alpha", true, false, false},
		{DevOperatorToken, RoleOperator, "anything", true, false, true},
		{DevOperatorAlphaToken, RoleOperator, "alpha", true, false, true},
		{DevOperatorAlphaToken, RoleOperator, "beta", true, false, false},
	}
	for _, tc := range tests {
		p, ok := s.Lookup(tc.token)
		if !ok {
			t.Fatalf("Lookup(%s) found nothing", tc.token)
		}
		if got := p.Can(tc.role); got != tc.wantCan {
			t.Errorf("%s Can(%s) = %v, want %v", tc.token, tc.role, got, tc.wantCan)
		}
		if got := p.SubmitterOf(tc.team); got != tc.wantSubmitter {
			t.Errorf("%s SubmitterOf(%s) = %v, want %v", tc.token, tc.team, got, tc.wantSubmitter)
		}
		if got := p.InScope(tc.team); got != tc.wantScope {
			t.Errorf("%s InScope(%s) = %v, want %v", tc.token, tc.team, got, tc.wantScope)
		}
	}

	t.Run("An operator who also submits for one team submits for that team only", func(t *testing.T) {
		set, err := Parse([]byte(`{"principals":[{"name":"both","token":"both-secret","team":"alpha","scope":["*"],"roles":["submitter","operator"]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		p, _ := set.Lookup("both-secret")
		if !p.SubmitterOf("alpha") || p.SubmitterOf("beta") || !p.InScope("beta") {
			t.Errorf("SubmitterOf(alpha)=%v SubmitterOf(beta)=%v InScope(beta)=%v; want true, false, true",
				p.SubmitterOf("alpha"), p.SubmitterOf("beta"), p.InScope("beta"))
		}
	})
}

// TestInterceptor checks the unary interceptor: principal in context,
// UNAUTHENTICATED with ErrorInfo otherwise, health exempt.
func TestInterceptor(t *testing.T) {
	t.Parallel()
	icpt := DevPrincipals().UnaryServerInterceptor()
	var gotPrincipal Principal
	var gotOK bool
	handler := func(ctx context.Context, req any) (any, error) {
		gotPrincipal, gotOK = FromContext(ctx)
		return "ok", nil
	}
	call := func(method, authz string) error {
		ctx := context.Background()
		if authz != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", authz))
		}
		gotPrincipal, gotOK = Principal{}, false
		_, err := icpt(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, handler)
		return err
	}

	t.Run("A known token puts its principal in the context", func(t *testing.T) {
		if err := call("/leasehold.v1.JobService/GetJob", "Bearer dev-alpha"); err != nil {
			t.Fatalf("call: %v", err)
		}
		if !gotOK || gotPrincipal.Name != "dev-alpha" {
			t.Errorf("principal = %+v, %v; want dev-alpha", gotPrincipal, gotOK)
		}
	})
	for _, tc := range []struct{ name, authz string }{
		{"A missing token is UNAUTHENTICATED", ""},
		{"An unknown token is UNAUTHENTICATED", "Bearer nope"},
		{"Another scheme is UNAUTHENTICATED", "Basic dev-alpha"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := call("/leasehold.v1.JobService/GetJob", tc.authz)
			st := status.Convert(err)
			if st.Code() != codes.Unauthenticated {
				t.Fatalf("code = %v, want Unauthenticated", st.Code())
			}
			var reason string
			for _, d := range st.Details() {
				if info, ok := d.(*errdetails.ErrorInfo); ok {
					reason = info.GetReason()
				}
			}
			if reason != "UNAUTHENTICATED" {
				t.Errorf("reason = %q, want UNAUTHENTICATED", reason)
			}
		})
	}
	t.Run("The health service needs no token", func(t *testing.T) {
		if err := call("/grpc.health.v1.Health/Check", ""); err != nil {
			t.Fatalf("call: %v", err)
		}
		if gotOK {
			t.Errorf("a principal was set without a token")
		}
	})
}

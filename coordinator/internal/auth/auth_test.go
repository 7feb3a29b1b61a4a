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
			{"name":"alpha-svc","token":"alpha-secret-token","team":"alpha","roles":["submitter"]},
			{"name":"ops","token":"ops-secret-token","roles":["operator"],"scope":["alpha","beta"]},
			{"name":"pool","token":"pool-secret-token","roles":["renderer"],"renderer_id_prefix":"pool-a-"}]}`))
		if err != nil {
			t.Fatalf("Parse: %v", err)
		}
		if got, want := s.Len(), 3; got != want {
			t.Fatalf("Len = %d, want %d", got, want)
		}
		got, ok := s.Lookup("ops-secret-token")
		if !ok {
			t.Fatalf("Lookup(ops-secret-token) found nothing")
		}
		want := Principal{Name: "ops", Scope: []string{"alpha", "beta"}, Roles: []Role{RoleOperator}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("principal (-want +got):\n%s", diff)
		}
		if _, ok := s.Lookup("ops-secret-tokeN"); ok {
			t.Errorf("Lookup of a near-miss token found a principal")
		}
	})

	bad := []struct {
		name, json, wantErr string
	}{
		{"A renderer without renderer ids or a prefix is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["renderer"]}]}`, "needs renderer_ids or renderer_id_prefix"},
		{"A renderer with an empty id list and no prefix is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["renderer"],"renderer_ids":[]}]}`, "needs renderer_ids or renderer_id_prefix"},
		{"An explicitly empty renderer id prefix is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["renderer"],"renderer_id_prefix":""}]}`, `renderer_id_prefix "" must be non-empty`},
		{"A renderer id prefix with spaces is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["renderer"],"renderer_id_prefix":" pool"}]}`, "without surrounding spaces"},
		{"An empty renderer id is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["renderer"],"renderer_ids":["r-1",""]}]}`, "an id must be non-empty"},
		{"The wildcard id mixed with others is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["renderer"],"renderer_ids":["*","r-1"]}]}`, "listed alone"},
		{"A zero max_capacity is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["renderer"],"renderer_ids":["r-1"],"max_capacity":0}]}`, "max_capacity must be at least 1"},
		{"Renderer keys on a submitter are refused", `{"principals":[{"name":"a","token":"1234567812345678","team":"alpha","roles":["submitter"],"renderer_ids":["r-1"]}]}`, "serve only the renderer role"},
		{"max_capacity on an operator is refused", `{"principals":[{"name":"a","token":"1234567812345678","scope":["*"],"roles":["operator"],"max_capacity":8}]}`, "serve only the renderer role"},
		{"An empty list is refused", `{"principals":[]}`, "no principals"},
		{"An unknown field is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["renderer"],"renderer_ids":["*"],"teams":["x"]}]}`, "unknown field"},
		{"A short token is refused", `{"principals":[{"name":"a","token":"short","roles":["renderer"],"renderer_ids":["*"]}]}`, "at least 16 bytes"},
		{"A repeated token is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["renderer"],"renderer_ids":["*"]},{"name":"b","token":"1234567812345678","roles":["renderer"],"renderer_ids":["*"]}]}`, "token repeats"},
		{"A repeated name is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["renderer"],"renderer_ids":["*"]},{"name":"a","token":"8765432187654321","roles":["renderer"],"renderer_ids":["*"]}]}`, "name repeats"},
		{"An unknown role is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["admin"]}]}`, "unknown role"},
		{"A submitter without a team is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["submitter"]}]}`, "needs a team"},
		{"An operator without a scope is refused", `{"principals":[{"name":"a","token":"1234567812345678","roles":["operator"]}]}`, "needs a scope"},
		{"A name with a control character is refused", `{"principals":[{"name":"a\u0000b","token":"1234567812345678","roles":["renderer"],"renderer_ids":["*"]}]}`, "name must be 1 to 128 bytes of text"},
		{"A name with a line break is refused", `{"principals":[{"name":"a\nb","token":"1234567812345678","roles":["renderer"],"renderer_ids":["*"]}]}`, "name must be"},
		{"A team that is not a team name is refused", `{"principals":[{"name":"a","token":"1234567812345678","team":"Alpha Team","roles":["submitter"]}]}`, "is not a team name"},
		{"A scope team that is not a team name is refused", `{"principals":[{"name":"a","token":"1234567812345678","scope":["alpha","b\u202Ed"],"roles":["operator"]}]}`, "is not a team name"},
		{"A submitter for every team is refused", `{"principals":[{"name":"a","token":"1234567812345678","team":"*","roles":["submitter"]}]}`, "one team"},
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
	if err := os.WriteFile(path, []byte(`{"principals":[{"name":"pool","token":"pool-secret-token","roles":["renderer"],"renderer_ids":["*"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := LoadFile(path)
	if err != nil {
		t.Fatalf("LoadFile: %v", err)
	}
	p, ok := s.Lookup("pool-secret-token")
	if !ok || !p.Can(RoleRenderer) {
		t.Errorf("Lookup(pool-secret-token) = %+v, %v; want a renderer", p, ok)
	}
	if _, err := LoadFile(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Errorf("LoadFile of a missing file succeeded")
	}
}

// TestRendererIdentity checks the renderer keys of the principals file and
// MayUseRendererID.
func TestRendererIdentity(t *testing.T) {
	t.Parallel()
	s, err := Parse([]byte(`{"principals":[
		{"name":"listed","token":"listed-secret-token","roles":["renderer"],"renderer_ids":["r-1","r-2","r-1"]},
		{"name":"pool","token":"pool-secret-token","roles":["renderer"],"renderer_id_prefix":"pool-a-","max_capacity":64},
		{"name":"both","token":"both-secret-token","roles":["renderer"],"renderer_ids":["solo"],"renderer_id_prefix":"pool-b-"},
		{"name":"any","token":"any-secret-token","roles":["renderer"],"renderer_ids":["*"]},
		{"name":"alpha-svc","token":"alpha-secret-token","team":"alpha","roles":["submitter"]}]}`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	lookup := func(token string) Principal {
		t.Helper()
		p, ok := s.Lookup(token)
		if !ok {
			t.Fatalf("Lookup(%s) found nothing", token)
		}
		return p
	}

	t.Run("The file's keys land on the principal, ids deduplicated", func(t *testing.T) {
		want := Principal{Name: "listed", Roles: []Role{RoleRenderer}, RendererIDs: []string{"r-1", "r-2"}, MaxCapacity: DefaultMaxCapacity}
		if diff := cmp.Diff(want, lookup("listed-secret-token")); diff != "" {
			t.Errorf("principal (-want +got):\n%s", diff)
		}
		want = Principal{Name: "pool", Roles: []Role{RoleRenderer}, RendererIDPrefix: "pool-a-", MaxCapacity: 64}
		if diff := cmp.Diff(want, lookup("pool-secret-token")); diff != "" {
			t.Errorf("principal (-want +got):\n%s", diff)
		}
		if got := lookup("alpha-secret-token").MaxCapacity; got != 0 {
			t.Errorf("a submitter's MaxCapacity = %d, want 0", got)
		}
	})

	dev, _ := DevPrincipals().Lookup(DevRendererToken)
	devAlpha, _ := DevPrincipals().Lookup(DevAlphaToken)
	tests := []struct {
		who  string
		p    Principal
		id   string
		want bool
	}{
		{"listed", lookup("listed-secret-token"), "r-1", true},
		{"listed", lookup("listed-secret-token"), "r-2", true},
		{"listed", lookup("listed-secret-token"), "r-3", false},
		{"listed", lookup("listed-secret-token"), "r-", false},
		{"listed", lookup("listed-secret-token"), "", false},
		{"pool", lookup("pool-secret-token"), "pool-a-7", true},
		{"pool", lookup("pool-secret-token"), "pool-b-7", false},
		{"pool", lookup("pool-secret-token"), "pool-a", false},
		{"pool", lookup("pool-secret-token"), "xpool-a-7", false},
		{"both", lookup("both-secret-token"), "solo", true},
		{"both", lookup("both-secret-token"), "pool-b-1", true},
		{"both", lookup("both-secret-token"), "solo-2", false},
		{"any", lookup("any-secret-token"), "anything", true},
		{"any", lookup("any-secret-token"), "", false},
		{"a submitter", lookup("alpha-secret-token"), "r-1", false},
		{"dev-renderer", dev, "whatever-1", true},
		{"dev-alpha", devAlpha, "whatever-1", false},
		{"a renderer built without ids", Principal{Name: "bare", Roles: []Role{RoleRenderer}}, "r-1", false},
		{"a non-renderer listing the wildcard", Principal{Name: "odd", Roles: []Role{RoleOperator}, RendererIDs: []string{AnyRendererID}}, "r-1", false},
	}
	for _, tc := range tests {
		if got := tc.p.MayUseRendererID(tc.id); got != tc.want {
			t.Errorf("%s MayUseRendererID(%q) = %v, want %v", tc.who, tc.id, got, tc.want)
		}
	}

	t.Run("The development renderer and renderers built by hand get the default capacity bound", func(t *testing.T) {
		if dev.MaxCapacity != DefaultMaxCapacity {
			t.Errorf("dev-renderer MaxCapacity = %d, want %d", dev.MaxCapacity, DefaultMaxCapacity)
		}
		set := NewSet(map[string]Principal{"hand-made": {Name: "hand", Roles: []Role{RoleRenderer}}})
		p, _ := set.Lookup("hand-made")
		if p.MaxCapacity != DefaultMaxCapacity {
			t.Errorf("NewSet renderer MaxCapacity = %d, want %d", p.MaxCapacity, DefaultMaxCapacity)
		}
	})
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
		set, err := Parse([]byte(`{"principals":[{"name":"both","token":"both-secret-token","team":"alpha","scope":["*"],"roles":["submitter","operator"]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		p, _ := set.Lookup("both-secret-token")
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
		ctx := fromLoopback()
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

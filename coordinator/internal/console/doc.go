// Package console is the coordinator's web console: server-rendered pages
// (html/template, with htmx refreshing the live parts) under /console/ on
// the coordinator's HTTP listener, for operators and for team owners.
//
// The console holds no rules of its own. Every page and action calls the
// gRPC service implementations of package server in process, with the
// signed-in principal in the context, exactly as the auth interceptor puts
// it there for a gRPC call: authorization, validation and the error table
// are the same code path, and an error reaches the page as the status a
// gRPC client would get. Where a page decides what to offer (a pause form,
// a preview), it asks the predicates the handlers themselves enforce
// (server.CanPause, server.CanReadArtifact, ...).
//
// Sign-in takes the same bearer tokens, looked up in the same principals
// set, and opens a server-side session named by a random cookie that is
// HttpOnly, SameSite=Strict, and Secure (with the __Host- prefix) when the
// listener serves TLS. Sessions live in memory: a restart signs everyone
// out. Every state-changing request must be a POST that carries the
// session's CSRF token, and is refused when the browser says it comes from
// another origin (Sec-Fetch-Site, Origin; net/http's
// CrossOriginProtection).
//
// Pages are usable by keyboard, with landmarks, labels and polite live
// regions, and readable 360 px wide. Assets, htmx included, are embedded:
// the console needs no network at build or run time.
package console

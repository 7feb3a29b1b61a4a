// Package console is the coordinator's web console: server-rendered pages
// (html/template, with htmx refreshing the live parts) under /console/ on
// the coordinator's HTTP listener, for operators and for team owners.
//
// The console holds no rules of its own. Every page and action is a gRPC
// call on a connection to the coordinator's own server (Config.Conn, in
// process), carrying the signed-in session's bearer token: the codec,
// authentication, validation, refusal metrics and logs, and the error
// table are those of any gRPC call, and an error reaches the page as the
// status a gRPC client would get. Where a page decides what to offer (a
// pause form, a preview), it asks the predicates the handlers themselves
// enforce (server.CanPause, server.CanReadArtifact, ...). A request whose
// path or form is not UTF-8 is refused before any call, as the
// coordinator's codec refuses such a message: it could not be encoded.
//
// Sign-in takes the same bearer tokens, looked up in the same principals
// set, and opens a server-side session named by a random cookie that is
// HttpOnly, SameSite=Strict, named for the listener's port, and Secure
// (with the __Host- prefix) when the listener serves TLS. Sessions live in
// memory: a restart signs everyone out. A session ends DefaultSessionTTL
// after sign-in or DefaultIdleTimeout after its browser's last request;
// each principal has at most MaxSessionsPerPrincipal. Failed sign-ins are
// throttled per remote address (MaxFailedSignIns in SignInWindow). A
// development token (auth.Principal.LoopbackOnly) signs in, and its
// session serves, only a browser on this machine. Every state-changing
// request must be a POST that carries the session's CSRF token, and is
// refused when the browser says it comes from another origin
// (Sec-Fetch-Site, Origin; net/http's CrossOriginProtection).
//
// The console answers only requests whose Host names it (see package
// hostcheck), against DNS rebinding; any other is refused 421.
//
// Pages are usable by keyboard, with landmarks, labels and polite live
// regions, and readable 360 px wide. Assets, htmx included, are embedded:
// the console needs no network at build or run time.
package console

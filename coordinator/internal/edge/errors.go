package edge

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/auth"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of this package's refusals,
// the one every coordinator error carries.
const ErrorDomain = auth.ErrorDomain

// malformedError returns the INVALID_ARGUMENT MALFORMED_REQUEST refusal of
// a message of type msgName whose field at path (empty when no one field
// is to blame) failed to decode with desc.
func malformedError(msgName, path, desc string) error {
	msg := "malformed request: " + desc
	if path != "" {
		msg = "malformed request: field " + path + ": " + desc
	}
	return withDetails(status.New(codes.InvalidArgument, msg),
		&errdetails.ErrorInfo{Reason: string(reason.MalformedRequest), Domain: ErrorDomain, Metadata: map[string]string{"message": msgName}},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: path, Description: desc}}},
	)
}

// tooManyStreamsError returns the RESOURCE_EXHAUSTED TOO_MANY_STREAMS
// refusal of a principal that holds limit streams of the named cap.
func tooManyStreamsError(principal, capName string, limit int) error {
	return withDetails(
		status.Newf(codes.ResourceExhausted, "principal %q already holds %d %s streams, the most allowed; close one first", principal, limit, capName),
		&errdetails.ErrorInfo{Reason: string(reason.TooManyStreams), Domain: ErrorDomain, Metadata: map[string]string{
			"principal": principal, "stream_cap": capName, "limit": strconv.Itoa(limit),
		}},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject:     "principal:" + principal,
			Description: fmt.Sprintf("at most %d concurrent %s streams per principal", limit, capName),
		}}},
	)
}

// withDetails returns st's error with details attached; st alone if they
// cannot be encoded.
func withDetails(st *status.Status, details ...protoadapt.MessageV1) error {
	if d, err := st.WithDetails(details...); err == nil {
		st = d
	}
	return st.Err()
}

// cleanText returns s as valid UTF-8 of at most maxBytes bytes, so that it
// can travel in a status message and in proto3 string fields.
func cleanText(s string, maxBytes int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxBytes {
		return s
	}
	s = s[:maxBytes]
	return strings.ToValidUTF8(s, "") + "…"
}

package edge

import (
	"bytes"
	"crypto/rand"
	"fmt"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// markField is the field number of the mark ServerCodec leaves on a message
// it could not decode: the highest valid one, which no .proto of ours will
// use.
const markField = protowire.MaxValidNumber

// Fields of the mark, itself encoded as a message.
const (
	markNonce protowire.Number = 1
	markPath  protowire.Number = 2
	markDesc  protowire.Number = 3
)

// Bounds of what a mark carries and of the diagnosis.
const (
	maxPathBytes  = 256
	maxDescBytes  = 512
	maxDiagDepth  = 64
	nonceByteSize = 16
)

// nonce is this process's secret in every mark, so that a client sending
// field markField itself is not taken for a malformed request.
var nonce = func() []byte {
	b := make([]byte, nonceByteSize)
	rand.Read(b) // never fails (crypto/rand: "Read ... never returns an error")
	return b
}()

// codec is the proto codec that marks undecodable messages instead of
// failing; see ServerCodec.
type codec struct {
	base encoding.CodecV2
}

// ServerCodec returns the coordinator's server codec, to be installed with
// grpc.ForceServerCodecV2. It encodes and decodes exactly as grpc-go's proto
// codec (whose name it carries, so clients see no difference). When
// decoding a proto message fails, Unmarshal resets the message, marks it
// (see the package documentation) and returns nil, so that
// MalformedUnaryInterceptor or MalformedStreamInterceptor can refuse the
// call with INVALID_ARGUMENT instead of grpc-go answering INTERNAL. Without
// one of those interceptors on the method a marked message reaches the
// handler empty: install the codec and both interceptors together.
func ServerCodec() encoding.CodecV2 {
	return codec{base: encoding.GetCodecV2(grpcproto.Name)}
}

// Marshal implements encoding.CodecV2.
func (c codec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

// Name implements encoding.CodecV2; it is the proto codec's name.
func (codec) Name() string { return grpcproto.Name }

// Unmarshal implements encoding.CodecV2. Only the failure path does more
// than the proto codec: it diagnoses the bytes and marks the message.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	path, desc := diagnose(m.ProtoReflect().Descriptor(), data.Materialize(), 0)
	if desc == "" {
		desc = err.Error()
	}
	proto.Reset(m)
	m.ProtoReflect().SetUnknown(encodeMark(path, desc))
	return nil
}

// encodeMark returns the unknown-field bytes of a mark.
func encodeMark(path, desc string) []byte {
	var inner []byte
	inner = protowire.AppendTag(inner, markNonce, protowire.BytesType)
	inner = protowire.AppendBytes(inner, nonce)
	inner = protowire.AppendTag(inner, markPath, protowire.BytesType)
	inner = protowire.AppendString(inner, cleanText(path, maxPathBytes))
	inner = protowire.AppendTag(inner, markDesc, protowire.BytesType)
	inner = protowire.AppendString(inner, cleanText(desc, maxDescBytes))
	out := protowire.AppendTag(nil, markField, protowire.BytesType)
	return protowire.AppendBytes(out, inner)
}

// mark is what the codec left on a message it could not decode.
type mark struct {
	msgName, path, desc string
}

// markOf returns the mark on v, if ServerCodec left one. This is the check
// every request pays: for a well-formed message it is a type assertion and
// a length test of its (empty) unknown fields.
func markOf(v any) (mark, bool) {
	m, ok := v.(proto.Message)
	if !ok {
		return mark{}, false
	}
	r := m.ProtoReflect()
	u := r.GetUnknown()
	if len(u) == 0 {
		return mark{}, false
	}
	return scanMark(string(r.Descriptor().FullName()), u)
}

// scanMark looks for a mark carrying this process's nonce among the
// unknown fields u.
func scanMark(msgName string, u []byte) (mark, bool) {
	for len(u) > 0 {
		num, typ, n := protowire.ConsumeTag(u)
		if n < 0 {
			return mark{}, false
		}
		u = u[n:]
		vn := protowire.ConsumeFieldValue(num, typ, u)
		if vn < 0 {
			return mark{}, false
		}
		if num == markField && typ == protowire.BytesType {
			inner, _ := protowire.ConsumeBytes(u[:vn])
			if mk, ok := decodeMark(inner); ok {
				mk.msgName = msgName
				return mk, true
			}
		}
		u = u[vn:]
	}
	return mark{}, false
}

// decodeMark decodes a mark's fields and checks its nonce.
func decodeMark(b []byte) (mark, bool) {
	var mk mark
	nonceOK := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return mark{}, false
		}
		b = b[n:]
		v, vn := protowire.ConsumeBytes(b)
		if vn < 0 {
			return mark{}, false
		}
		b = b[vn:]
		switch num {
		case markNonce:
			nonceOK = bytes.Equal(v, nonce)
		case markPath:
			mk.path = string(v)
		case markDesc:
			mk.desc = string(v)
		}
	}
	return mk, nonceOK
}

// err returns the refusal of the marked message.
func (mk mark) err() error { return malformedError(mk.msgName, mk.path, mk.desc) }

// diagnose finds what in b, the encoding of a message of type md, fails to
// decode: the path of the first field that fails on its own (such as
// "documents[2].name") and the decoder's error, or the wire-format error
// where the bytes stop parsing. It returns an empty desc when no one field
// is to blame. It runs only on the failure path, so it decodes each field
// again rather than reimplementing the decoder's rules.
func diagnose(md protoreflect.MessageDescriptor, b []byte, depth int) (path, desc string) {
	seen := make(map[protowire.Number]int)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", "invalid wire-format data: " + protowire.ParseError(n).Error()
		}
		fd := md.Fields().ByNumber(num)
		name := fieldPath(fd, num, typ, seen)
		vn := protowire.ConsumeFieldValue(num, typ, b[n:])
		if vn < 0 {
			return name, "invalid wire-format data: " + protowire.ParseError(vn).Error()
		}
		field := b[:n+vn]
		b = b[n+vn:]
		if fd == nil {
			continue
		}
		err := proto.Unmarshal(field, dynamicpb.NewMessage(md))
		if err == nil {
			continue
		}
		if fd.Message() != nil && typ == protowire.BytesType && depth < maxDiagDepth {
			inner, _ := protowire.ConsumeBytes(field[n:])
			if sub, subDesc := diagnose(fd.Message(), inner, depth+1); subDesc != "" {
				if sub == "" {
					return name, subDesc
				}
				return name + "." + sub, subDesc
			}
		}
		return name, err.Error()
	}
	return "", ""
}

// fieldPath names the field numbered num, sent with wire type typ, for a
// path: its name, with the element's index for a repeated field sent one
// element per occurrence (a packed list is named whole). seen counts the
// occurrences so far.
func fieldPath(fd protoreflect.FieldDescriptor, num protowire.Number, typ protowire.Type, seen map[protowire.Number]int) string {
	if fd == nil {
		return fmt.Sprintf("#%d", num)
	}
	i := seen[num]
	seen[num]++
	packed := fd.IsList() && typ == protowire.BytesType && fd.Kind() != protoreflect.StringKind &&
		fd.Kind() != protoreflect.BytesKind && fd.Kind() != protoreflect.MessageKind
	if (fd.IsList() || fd.IsMap()) && !packed {
		return fmt.Sprintf("%s[%d]", fd.Name(), i)
	}
	return string(fd.Name())
}

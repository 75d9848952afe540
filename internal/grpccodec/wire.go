package grpccodec

import (
	"errors"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The helpers of the decoders. Each decoder reads a message as
// protobuf-go's proto.Unmarshal does, so that what both accept decodes to
// equal messages (FuzzRateLimitRequest holds them to it):
//
//   - fields in any order; a scalar given twice keeps the last value, a
//     message field given twice merges the second into the first, a
//     repeated field appends;
//   - a known field number with another wire type than its own is an
//     unknown field;
//   - unknown fields are kept, in order, each as its tag (re-encoded as
//     protowire.AppendTag does) and its value bytes;
//   - a tag with field number 0 or above protowire.MaxValidNumber, an end
//     group outside a group, a truncated or overlong varint or length are
//     errors (errWire);
//
// with one difference, the point of it all: a string is taken as the bytes
// it holds, valid UTF-8 or not.

// errWire is the error of data that is not valid protobuf wire format.
var errWire = errors.New("cannot parse invalid wire-format data")

// field is one field read by next.
type field struct {
	num protowire.Number
	typ protowire.Type
	// raw is the field's value as on the wire: the bytes of a
	// length-delimited field without their length, the varint, fixed or
	// group bytes otherwise.
	raw []byte
	// varint is the value of a varint field.
	varint uint64
	// wire is the field's value bytes as they came (with the length of a
	// length-delimited field), to keep it as an unknown field.
	wire []byte
}

// reader reads the fields of one message.
type reader struct {
	b       []byte
	unknown []byte // the unknown fields read so far
}

// next reads the next field into f; false at the end of the message or on
// error (err then says which).
func (r *reader) next(f *field) (bool, error) {
	if len(r.b) == 0 {
		return false, nil
	}
	var tag uint64
	var n int
	if r.b[0] < 0x80 {
		tag, n = uint64(r.b[0]), 1
	} else if tag, n = protowire.ConsumeVarint(r.b); n < 0 {
		return false, errWire
	}
	num := tag >> 3
	if num < uint64(protowire.MinValidNumber) || num > uint64(protowire.MaxValidNumber) {
		return false, errWire
	}
	f.num, f.typ = protowire.Number(num), protowire.Type(tag&7)
	r.b = r.b[n:]
	start := r.b
	switch f.typ {
	case protowire.VarintType:
		v, n := protowire.ConsumeVarint(r.b)
		if n < 0 {
			return false, errWire
		}
		f.varint, f.raw, r.b = v, r.b[:n], r.b[n:]
	case protowire.BytesType:
		v, n := protowire.ConsumeBytes(r.b)
		if n < 0 {
			return false, errWire
		}
		f.raw, r.b = v, r.b[n:]
	default:
		// Fixed-size values, groups; an end group here (outside a
		// group) and the unused wire types 6 and 7 are errors.
		n := protowire.ConsumeFieldValue(f.num, f.typ, r.b)
		if n < 0 {
			return false, errWire
		}
		f.raw, r.b = r.b[:n], r.b[n:]
	}
	f.wire = start[:len(start)-len(r.b)]
	return true, nil
}

// skip keeps f as an unknown field.
func (r *reader) skip(f *field) {
	r.unknown = protowire.AppendTag(r.unknown, f.num, f.typ)
	r.unknown = append(r.unknown, f.wire...)
}

// done adds the unknown fields read to m's (a message merged into keeps
// those it had).
func (r *reader) done(m proto.Message) {
	if len(r.unknown) == 0 {
		return
	}
	pm := m.ProtoReflect()
	if have := pm.GetUnknown(); len(have) > 0 {
		r.unknown = append(have[:len(have):len(have)], r.unknown...)
	}
	pm.SetUnknown(r.unknown)
}

// str returns the bytes of a string field as a string (a copy), and
// whether they are valid UTF-8.
func str(b []byte) (string, bool) {
	return string(b), utf8.Valid(b)
}

// sub returns the bytes b, which lie within whole, as a substring of s,
// a string holding a copy of whole, and whether they are valid UTF-8: the
// strings of one small message then share one allocation. b must be a
// slice of whole as next cuts it (up to whole's capacity).
func sub(s string, whole, b []byte) (string, bool) {
	off := cap(whole) - cap(b)
	v := s[off : off+len(b)]
	return v, utf8.ValidString(v)
}

package main

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"

	"golang.org/x/net/http2"
)

// TestFrameScannerInPieces: the client preface and a run of frames, fed
// in pieces of random sizes (one byte up), give each frame's header and a
// PING's payload, whatever the cuts.
func TestFrameScannerInPieces(t *testing.T) {
	var buf bytes.Buffer
	io.WriteString(&buf, http2.ClientPreface)
	fr := http2.NewFramer(&buf, nil)
	fr.WriteSettings()
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("abc"), EndHeaders: true})
	fr.WriteData(1, true, make([]byte, 20000))
	fr.WritePing(true, goAwayPing)
	fr.WriteRSTStream(3, http2.ErrCodeCancel)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: make([]byte, 300), EndHeaders: true, EndStream: true})
	want := []frameHeader{
		{typ: h2FrameSettings},
		{typ: h2FrameHeaders, flags: 0x4, stream: 1},
		{typ: h2FrameData, flags: h2FlagEndStream, stream: 1},
		{typ: h2FramePing, flags: h2FlagAck, ping: goAwayPing},
		{typ: h2FrameRSTStream, stream: 3},
		{typ: h2FrameHeaders, flags: 0x5, stream: 5},
	}
	wire := buf.Bytes()
	for run := range 200 {
		var got []frameHeader
		s := frameScanner{preface: h2ClientPreface}
		for b := wire; len(b) > 0; {
			k := 1 + rand.IntN(min(len(b), 1+run*50))
			s.scan(b[:k], func(f frameHeader) { got = append(got, f) })
			b = b[k:]
		}
		if len(got) != len(want) || !s.atBoundary() {
			t.Fatalf("run %d: %d frames %+v (at a boundary: %v), want %+v", run, len(got), got, s.atBoundary(), want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("run %d: frame %d is %+v, want %+v", run, i, got[i], want[i])
			}
		}
	}
}

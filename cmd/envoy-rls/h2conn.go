package main

import (
	be "encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
)

// The HTTP/2 frames h2Conn reads and writes.
const (
	h2FrameData      = 0x0
	h2FrameSettings  = 0x4
	h2FrameHeaders   = 0x1
	h2FrameRSTStream = 0x3
	h2FramePing      = 0x6
	h2FrameGoAway    = 0x7
	h2FlagEndStream  = 0x1
	h2FlagAck        = 0x1
	h2MaxStreamID    = 1<<31 - 1
	h2ClientPreface  = len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
)

// How an evicted gRPC connection is closed: a GOAWAY that still admits
// every stream (last stream 2^31-1) and a PING; the PING's answer shows the client has seen the GOAWAY
// and will open no more streams, so a second GOAWAY can name the last
// stream it opened (as grpc-go's own graceful close does). The connection
// is closed once the second GOAWAY is written and its streams are done, or
// goAwayAckTimeout after the first GOAWAY without an answer (a client that
// reads nothing), and at the latest evictDrainMax after the first (a call
// still in progress then is cut off).
const (
	goAwayAckTimeout = time.Second
	evictDrainMax    = 10 * time.Second
)

// goAwayPing is the payload of the PING sent with the first GOAWAY.
var goAwayPing = [8]byte{'e', 'v', 'i', 'c', 't', 'i', 'n', 'g'}

// h2Conn is a gRPC connection whose HTTP/2 frame headers it reads and
// writes are followed (payloads are skipped, not parsed): it tells its
// listener when the connection has a call in progress and when it has
// none, and can close it gracefully.
type h2Conn struct {
	net.Conn
	tc *trackedConn
	rd frameScanner // grpc-go's reader goroutine only
	// prefaced is set once the client's preface is read.
	prefaced atomic.Bool

	wmu sync.Mutex // the writes, grpc-go's and goAway's
	wr  frameScanner

	mu         sync.Mutex
	streams    map[uint32]struct{} // open: the client's HEADERS seen, no end of either side
	lastStream uint32
	phase      uint8 // 0; 1: first GOAWAY sent; 2: second sent
}

// newH2Conn follows the frames of c, the plain or TLS connection over tc.
func newH2Conn(tc *trackedConn, c net.Conn) *h2Conn {
	h := &h2Conn{Conn: c, tc: tc, streams: map[uint32]struct{}{}}
	h.rd.preface = h2ClientPreface
	tc.h2.Store(h)
	return h
}

func (h *h2Conn) Read(b []byte) (int, error) {
	n, err := h.Conn.Read(b)
	h.rd.scan(b[:n], h.readFrame)
	if h.rd.preface == 0 && !h.prefaced.Load() {
		h.prefaced.Store(true)
	}
	return n, err
}

func (h *h2Conn) Write(b []byte) (int, error) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	n, err := h.Conn.Write(b)
	h.wr.scan(b[:n], h.wroteFrame)
	return n, err
}

// readFrame follows a frame the client sent.
func (h *h2Conn) readFrame(f frameHeader) {
	switch f.typ {
	case h2FrameHeaders:
		h.mu.Lock()
		if f.stream%2 == 1 && f.stream > h.lastStream {
			h.lastStream = f.stream
			h.streams[f.stream] = struct{}{}
			if len(h.streams) == 1 {
				h.tc.l.busy(h.tc)
			}
		}
		h.mu.Unlock()
	case h2FrameRSTStream:
		h.streamDone(f.stream)
	case h2FramePing:
		if f.flags&h2FlagAck != 0 && f.ping == goAwayPing {
			h.lastGoAway()
		}
	}
}

// wroteFrame follows a frame the server sent.
func (h *h2Conn) wroteFrame(f frameHeader) {
	switch f.typ {
	case h2FrameHeaders, h2FrameData:
		if f.flags&h2FlagEndStream != 0 {
			h.streamDone(f.stream)
		}
	case h2FrameRSTStream:
		h.streamDone(f.stream)
	}
}

// streamDone records the end of a stream.
func (h *h2Conn) streamDone(id uint32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.streams[id]; !ok {
		return
	}
	delete(h.streams, id)
	if len(h.streams) > 0 {
		return
	}
	if h.phase == 2 {
		go h.Conn.Close() // not under the write lock this may be called with
		return
	}
	h.tc.l.idleNow(h.tc)
}

// goAway closes the connection gracefully: see goAwayAckTimeout. It may
// block on a client that does not read, for up to evictDrainMax.
func (h *h2Conn) goAway() {
	h.mu.Lock()
	if h.phase != 0 {
		h.mu.Unlock()
		return
	}
	h.phase = 1
	h.mu.Unlock()
	// Also when grpc-go's writer is stuck on a client that reads nothing:
	// the close unblocks it and the write below.
	time.AfterFunc(evictDrainMax, func() { h.Conn.Close() })
	var frames []byte
	frames = appendGoAway(frames, h2MaxStreamID)
	frames = appendFrameHeader(frames, 8, h2FramePing, 0, 0)
	frames = append(frames, goAwayPing[:]...)
	if !h.writeFrames(frames, true) {
		h.Conn.Close()
		return
	}
	time.AfterFunc(goAwayAckTimeout, func() {
		h.mu.Lock()
		noAck := h.phase == 1
		h.mu.Unlock()
		if noAck {
			h.Conn.Close()
		}
	})
}

// lastGoAway sends the second GOAWAY, naming the last stream the client
// opened before it saw the first, which may still finish.
func (h *h2Conn) lastGoAway() {
	h.mu.Lock()
	if h.phase != 1 {
		h.mu.Unlock()
		return
	}
	h.phase = 2
	last, open := h.lastStream, len(h.streams)
	h.mu.Unlock()
	if !h.writeFrames(appendGoAway(nil, last), false) || open == 0 {
		h.Conn.Close()
	}
}

// writeFrames writes frames between grpc-go's, at a frame boundary after
// the server's first frame (its SETTINGS); first bounds the write by
// goAwayAckTimeout. It reports whether they were written.
func (h *h2Conn) writeFrames(frames []byte, first bool) bool {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	if !h.wr.atBoundary() || h.wr.frames == 0 {
		return false
	}
	if first {
		_ = h.Conn.SetWriteDeadline(time.Now().Add(goAwayAckTimeout))
		defer h.Conn.SetWriteDeadline(time.Time{})
	}
	_, err := h.Conn.Write(frames)
	return err == nil
}

func appendGoAway(b []byte, last uint32) []byte {
	b = appendFrameHeader(b, 8, h2FrameGoAway, 0, 0)
	b = be.BigEndian.AppendUint32(b, last)
	return be.BigEndian.AppendUint32(b, 0) // NO_ERROR
}

func appendFrameHeader(b []byte, length uint32, typ, flags uint8, stream uint32) []byte {
	b = append(b, byte(length>>16), byte(length>>8), byte(length), typ, flags)
	return be.BigEndian.AppendUint32(b, stream)
}

// frameHeader is what a frameScanner reports of a frame: its header and,
// for an 8-byte PING, its payload.
type frameHeader struct {
	typ, flags uint8
	stream     uint32
	ping       [8]byte
}

// frameScanner finds the HTTP/2 frame headers in a byte stream fed to it
// in pieces of any size, skipping the client preface first if preface is
// set.
type frameScanner struct {
	preface int
	hdr     [9]byte
	n       int    // bytes of hdr read
	skip    uint32 // payload bytes still to skip
	cur     frameHeader
	ping    int // PING payload bytes still to read
	frames  uint64
}

func (s *frameScanner) atBoundary() bool { return s.preface == 0 && s.n == 0 && s.skip == 0 }

// scan feeds b, calling frame for each frame whose header (and PING
// payload) is complete.
func (s *frameScanner) scan(b []byte, frame func(frameHeader)) {
	for len(b) > 0 {
		switch {
		case s.preface > 0:
			k := min(s.preface, len(b))
			s.preface -= k
			b = b[k:]
		case s.skip > 0:
			k := min(int(s.skip), len(b))
			if s.ping > 0 {
				copy(s.cur.ping[8-s.ping:], b[:k])
				s.ping -= k
				if s.ping == 0 {
					frame(s.cur)
				}
			}
			s.skip -= uint32(k)
			b = b[k:]
		default:
			k := copy(s.hdr[s.n:], b)
			s.n += k
			b = b[k:]
			if s.n < len(s.hdr) {
				continue
			}
			s.n = 0
			s.frames++
			s.skip = uint32(s.hdr[0])<<16 | uint32(s.hdr[1])<<8 | uint32(s.hdr[2])
			s.cur = frameHeader{typ: s.hdr[3], flags: s.hdr[4], stream: be.BigEndian.Uint32(s.hdr[5:]) & h2MaxStreamID}
			if s.cur.typ == h2FramePing && s.skip == 8 {
				s.ping = 8
				continue
			}
			frame(s.cur)
		}
	}
}

// h2Credentials are TLS credentials whose connections are followed as
// h2Conns once the handshake is done (a listener cannot read the frames
// inside TLS).
type h2Credentials struct {
	credentials.TransportCredentials
}

func (c h2Credentials) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return conn, info, err
	}
	if tc, ok := raw.(*trackedConn); ok {
		conn = newH2Conn(tc, conn)
	}
	return conn, info, nil
}

func (c h2Credentials) Clone() credentials.TransportCredentials {
	return h2Credentials{c.TransportCredentials.Clone()}
}

// grpcConnListener bounds the gRPC listener l to n connections, following
// each one's calls (TLS ones through h2Credentials): see limitListener.
func grpcConnListener(l net.Listener, n int, firstRequest time.Duration, tls bool) *limitListener {
	ll := newLimitListener(l, n, 0)
	// Until its HTTP/2 preface is read, a connection is grpc-go's to
	// close (grpc.ConnectionTimeout, the same time).
	ll.firstRequest = firstRequest
	ll.started = func(c *trackedConn) bool {
		h := c.h2.Load()
		return h != nil && h.prefaced.Load()
	}
	ll.evict = func(c *trackedConn) {
		if h := c.h2.Load(); h != nil {
			go h.goAway()
			return
		}
		c.Conn.Close() // TLS handshake not done: no HTTP/2 yet
	}
	if !tls {
		ll.wrap = func(tc *trackedConn) net.Conn { return newH2Conn(tc, tc) }
	}
	return ll
}

package redis

import (
	"strings"
)

// HashTagged returns the counter key rest prefixed with the Redis Cluster
// hash tag of tag, "{tag}rest", so that all keys made with one tag share a
// cluster slot (and one atomic script call). Braces and '%' in tag are
// percent-encoded and an empty tag becomes "%", so the result is a distinct
// key for every distinct (tag, rest) and its hash tag is never empty. Give
// the limits that must be decided together (those of one descriptor, or of
// one request when that is possible) one tag.
func HashTagged(tag, rest string) string {
	var b strings.Builder
	b.Grow(len(tag) + len(rest) + 3)
	b.WriteByte('{')
	if tag == "" {
		b.WriteByte('%')
	}
	for i := 0; i < len(tag); i++ {
		switch c := tag[i]; c {
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		case '%':
			b.WriteString("%25")
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('}')
	b.WriteString(rest)
	return b.String()
}

// Slot returns the Redis Cluster hash slot of key: CRC16 of its hash tag
// (the bytes between the first '{' and the next '}', if not empty) or of
// the whole key, modulo 16384.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the hash of
// Redis Cluster.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

package redis

import (
	"strings"

	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// tagLen is the length of a partition's hash tag: "{" + 16 hex digits + "}".
const tagLen = 1 + 16 + 1

// redisKey returns the Redis key of it: prefix, then, when the item has a
// Partition, the hash tag "{%016x}" of it, then its Key. Every item of one
// partition thus lands in one Cluster slot and is decided by one atomic
// script call. The tag has a fixed length, so distinct (Partition, Key)
// pairs give distinct keys; prefix holds no braces (New checks), so the tag
// is the key's first hash tag. An item without a Partition is placed by its
// whole Key (or by a hash tag the Key holds itself).
func redisKey(prefix string, it *backend.Item) string {
	if it.Partition == 0 {
		return prefix + it.Key
	}
	var b strings.Builder
	b.Grow(len(prefix) + tagLen + len(it.Key))
	b.WriteString(prefix)
	b.WriteByte('{')
	const hexdigits = "0123456789abcdef"
	for i := 0; i < 16; i++ {
		b.WriteByte(hexdigits[(it.Partition>>(60-4*uint(i)))&0xf])
	}
	b.WriteByte('}')
	b.WriteString(it.Key)
	return b.String()
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// slot returns the Redis Cluster hash slot of key: CRC16 of its hash tag
// (the bytes between the first '{' and the next '}', if not empty) or of
// the whole key, modulo 16384.
func slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % clusterSlots)
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

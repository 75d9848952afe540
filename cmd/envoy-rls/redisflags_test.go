package main

// mustRedisURL is a parsed --redis-url for tests; it panics on a value
// UnmarshalText refuses.
func mustRedisURL(s string) redisURLFlag {
	var f redisURLFlag
	if err := f.UnmarshalText([]byte(s)); err != nil {
		panic(err)
	}
	return f
}

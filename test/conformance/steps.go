package main

import (
	"fmt"
	"strings"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The request steps a scenario replays.

type entry struct{ k, v string }

// desc is one request descriptor.
type desc struct {
	entries  []entry
	hits     *uint64 // the descriptor's own hits_addend
	override *commonv3.RateLimitDescriptor_RateLimitOverride
	// fromMeta takes the value of the descriptor's only entry from the
	// previous response's dynamic metadata (metadata.service_with_quota.name),
	// as Envoy's routing on that metadata does in the multi-service example.
	fromMeta bool
}

type step struct {
	domain   string
	descs    []desc
	hits     uint32 // the request's hits_addend
	reload   string // instead of a request: the new config
	intended string // why a difference here is intended (README's table)
	// ifAllowed sends the request only when the previous one was allowed
	// (a charge Envoy sends when a stream it let through is done).
	ifAllowed bool
}

func (s step) describe() string {
	var parts []string
	for _, d := range s.descs {
		var es []string
		for _, e := range d.entries {
			es = append(es, e.k+"="+e.v)
		}
		p := strings.Join(es, ",")
		if d.fromMeta {
			p += "<-metadata"
		}
		if d.hits != nil {
			p += fmt.Sprintf(" hits=%d", *d.hits)
		}
		if d.override != nil {
			p += fmt.Sprintf(" override=%d/%s", d.override.RequestsPerUnit, d.override.Unit)
		}
		parts = append(parts, "["+p+"]")
	}
	h := ""
	if s.hits > 0 {
		h = fmt.Sprintf(" hits_addend=%d", s.hits)
	}
	return s.domain + " " + strings.Join(parts, "") + h
}

func (s step) request(last *rlsv3.RateLimitResponse) *rlsv3.RateLimitRequest {
	if s.ifAllowed && (last == nil || last.OverallCode != rlsv3.RateLimitResponse_OK) {
		return nil
	}
	req := &rlsv3.RateLimitRequest{Domain: s.domain, HitsAddend: s.hits}
	for _, d := range s.descs {
		rd := &commonv3.RateLimitDescriptor{Limit: d.override}
		for _, e := range d.entries {
			v := e.v
			if d.fromMeta {
				v = last.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue()
				if v == "" {
					return nil
				}
			}
			rd.Entries = append(rd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: e.k, Value: v})
		}
		if d.hits != nil {
			rd.HitsAddend = wrap(*d.hits)
		}
		req.Descriptors = append(req.Descriptors, rd)
	}
	return req
}

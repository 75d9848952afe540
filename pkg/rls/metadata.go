package rls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/envoyrls/envoy-rls/internal/textsafe"
)

// MetadataKey is the key of dynamic_metadata under which an OVER_LIMIT
// answer names the denying rule: {"rule": ..., "domain": ...,
// "descriptor_index": ...}. Envoy stores the struct under the rate limit
// filter's namespace, so an access log prints the rule with
// %DYNAMIC_METADATA(envoy.filters.http.ratelimit:envoy_rls:rule)%.
const MetadataKey = "envoy_rls"

// requestMetadata is the reference's dynamic metadata: the domain, the
// descriptors, the request's hits_addend when set, and the merged metadata
// of the passed descriptors when there is any. Bytes of the domain, keys
// and values that are not valid UTF-8 appear as \xNN (textsafe.Escape).
func requestMetadata(req *rlsv3.RateLimitRequest, meta *structpb.Struct) *structpb.Struct {
	descs := make([]*structpb.Value, 0, len(req.Descriptors))
	for _, d := range req.Descriptors {
		if d == nil {
			continue
		}
		entries := make([]*structpb.Value, len(d.Entries))
		for i, e := range d.Entries {
			// Request bytes: structpb strings must be valid UTF-8.
			entries[i] = structpb.NewStringValue(textsafe.Escape(e.GetKey()) + "=" + textsafe.Escape(e.GetValue()))
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if d.Limit != nil {
			f["limit"] = structpb.NewStringValue(d.Limit.String())
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	fields := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(textsafe.Escape(req.Domain)),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}
	if req.HitsAddend != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	if len(meta.GetFields()) > 0 {
		fields["metadata"] = structpb.NewStructValue(meta)
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata merges src into dst, as the reference server does: keys
// already in dst win, except that two mappings under one key merge the same
// way. dst is a fresh copy where it changes, never the config's own value.
func mergeMetadata(dst, src *structpb.Struct) *structpb.Struct {
	if dst == nil {
		dst = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	for k, v := range src.Fields {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = v
			continue
		}
		if hs, vs := have.GetStructValue(), v.GetStructValue(); hs != nil && vs != nil {
			merged := mergeMetadata(nil, hs) // copy: hs may be the config's
			dst.Fields[k] = structpb.NewStructValue(mergeMetadata(merged, vs))
		}
	}
	return dst
}

// denial is the dynamic metadata an OVER_LIMIT answer adds, allocated
// together (its maps apart).
type denial struct {
	outer, inner             structpb.Struct
	value, rule, domain, idx structpb.Value
	structValue              structpb.Value_StructValue
	ruleName, domainName     structpb.Value_StringValue
	index                    structpb.Value_NumberValue
}

// denialMetadata adds to dm (a new struct when nil) the denying rule under
// MetadataKey: {"rule": rule, "domain": domain, "descriptor_index": desc}.
func denialMetadata(dm *structpb.Struct, rule, domain string, desc int) *structpb.Struct {
	a := new(denial)
	a.ruleName.StringValue, a.rule.Kind = rule, &a.ruleName
	a.domainName.StringValue, a.domain.Kind = domain, &a.domainName
	a.index.NumberValue, a.idx.Kind = float64(desc), &a.index
	a.inner.Fields = map[string]*structpb.Value{"rule": &a.rule, "domain": &a.domain, "descriptor_index": &a.idx}
	a.structValue.StructValue, a.value.Kind = &a.inner, &a.structValue
	if dm == nil {
		dm = &a.outer
		dm.Fields = make(map[string]*structpb.Value, 1)
	}
	dm.Fields[MetadataKey] = &a.value
	return dm
}

package rls

import (
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rlheaders"
)

// scratch is the per-request working memory, pooled.
type scratch struct {
	entries   []descriptors.Entry
	path      []*descriptors.Node
	paths     []*descriptors.Node // the matched paths of all plans
	plans     []plan
	items     []backend.Item
	owners    []owner
	decisions []algorithms.Decision
	kb        keyBuilder
	budgetEnd budgetEnd          // why the last failed store call ran out of time
	policies  []rlheaders.Policy // the limits the quota fields describe
	pk        []byte             // their partition keys
	hdr       []byte             // the values of the response's header fields
}

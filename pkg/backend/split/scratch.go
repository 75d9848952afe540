package split

import (
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// scratch is the working space of one mixed request, pooled.
type scratch struct {
	ps, main       []backend.Item // the two parts, in request order
	psIdx, mainIdx []int          // their items' indices in the request
	psOut, mainOut []algorithms.Decision
	call           []backend.Item // a peek's or denied call's items
	callOut        []algorithms.Decision
	rw             []backend.Item // a part with rewritten modes
	groups         []group
	knownDenied    bool // set by rewrite
}

// group is what rewrite knows of one quota group.
type group struct {
	id                  int
	inX, inY, deniedInY bool
}

// split sorts items into the two parts.
func (sc *scratch) split(items []backend.Item, perSecond func(*backend.Item) bool) {
	sc.ps, sc.main = sc.ps[:0], sc.main[:0]
	sc.psIdx, sc.mainIdx = sc.psIdx[:0], sc.mainIdx[:0]
	for i := range items {
		if perSecond(&items[i]) {
			sc.ps, sc.psIdx = append(sc.ps, items[i]), append(sc.psIdx, i)
		} else {
			sc.main, sc.mainIdx = append(sc.main, items[i]), append(sc.mainIdx, i)
		}
	}
	sc.psOut, sc.mainOut = grow(sc.psOut, len(sc.ps)), grow(sc.mainOut, len(sc.main))
}

// rewrite returns the items of part X with the modes that make X's store
// commit exactly when the request is allowed, given the decisions dY of
// the other part Y (nil: every item of Y allows). Enforced items stay: any
// of them denying denies the request. A Quota item becomes Shadow (it no
// longer decides the verdict) when a quota group outside X is open, so the
// quota condition holds whatever X decides, or when its own group is
// already denied in Y. The others stay Quota: the request's quota
// condition then holds exactly when one of their groups has no denying
// item, which X's store checks. sc.knownDenied reports that every quota
// group is already denied, whatever X decides.
func (sc *scratch) rewrite(X, Y []backend.Item, dY []algorithms.Decision) []backend.Item {
	sc.rw = append(sc.rw[:0], X...)
	sc.knownDenied = false
	sc.groups = sc.groups[:0]
	for i := range Y {
		if Y[i].Mode == backend.Quota {
			g := sc.group(Y[i].Group)
			g.inY = true
			if dY != nil && !dY[i].Allowed {
				g.deniedInY = true
			}
		}
	}
	for i := range X {
		if X[i].Mode == backend.Quota {
			sc.group(X[i].Group).inX = true
		}
	}
	if len(sc.groups) == 0 {
		return sc.rw
	}
	openOutside := false
	for _, g := range sc.groups {
		if !g.inX && !g.deniedInY {
			openOutside = true
		}
	}
	left := false
	for i := range sc.rw {
		it := &sc.rw[i]
		if it.Mode != backend.Quota {
			continue
		}
		if openOutside || sc.group(it.Group).deniedInY {
			it.Mode = backend.Shadow
		} else {
			left = true
		}
	}
	sc.knownDenied = !openOutside && !left
	return sc.rw
}

// group returns the entry of quota group id, adding it when new.
func (sc *scratch) group(id int) *group {
	for i := range sc.groups {
		if sc.groups[i].id == id {
			return &sc.groups[i]
		}
	}
	sc.groups = append(sc.groups, group{id: id})
	return &sc.groups[len(sc.groups)-1]
}

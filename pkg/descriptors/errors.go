package descriptors

import (
	"sort"
	"strconv"
	"strings"
)

// Error is one problem found in a configuration file.
type Error struct {
	// File is the path of the file, as given to Load or Parse.
	File string
	// Line is the 1-based line of the problem, or 0 when no line applies
	// (an unreadable file, a YAML error without a position).
	Line int
	// Reason says what is wrong.
	Reason string
}

// Error returns "file:line: reason", or "file: reason" when Line is 0.
func (e *Error) Error() string {
	if e.Line > 0 {
		return e.File + ":" + strconv.Itoa(e.Line) + ": " + e.Reason
	}
	return e.File + ": " + e.Reason
}

// Errors is every problem found while loading a configuration. Load and
// Parse return an Errors value (never an empty one) when the configuration
// is invalid.
type Errors []*Error

// Error returns one "file:line: reason" per line.
func (es Errors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// sortByLine orders the errors of one file by line, keeping the order of
// errors on the same line.
func (es Errors) sortByLine() {
	sort.SliceStable(es, func(i, j int) bool { return es[i].Line < es[j].Line })
}

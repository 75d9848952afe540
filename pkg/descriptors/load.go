package descriptors

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Options select the files Load reads from a directory and how documents
// that name the same domain combine. The zero value is envoy-rls's own
// layout: the *.yaml and *.yml files of the directory itself, no dotfiles,
// one definition per domain.
type Options struct {
	// Recursive also reads the files of subdirectories, as the reference
	// server's runtime loader walks its directory. A symbolic link to a
	// directory is not followed (the reference does not follow it either);
	// links to files are.
	Recursive bool
	// AllFiles reads every regular file whatever its name, as the
	// reference does, not only *.yaml and *.yml.
	AllFiles bool
	// Dotfiles also reads files and directories whose name starts with "."
	// (the reference's RUNTIME_IGNOREDOTFILES=false). Kubernetes' atomic
	// writer entries (..data and the ..<timestamp> directory of a mounted
	// ConfigMap) are never read: they repeat the visible files, which the
	// reference then loads twice and refuses as duplicate domains.
	Dotfiles bool
	// MergeDomains lets several documents define one domain (the
	// reference's MERGE_DOMAIN_CONFIG): their top-level descriptors are
	// put together, in file order; a key and value defined by two of them
	// is an error.
	MergeDomains bool
	// Lenient accepts the files the reference server's config checker
	// accepts, with the reference's meaning, and reports each thing it
	// accepted that way in Config.Warnings: a field given twice in one
	// mapping (the last one is used), a field of the format where it
	// means nothing (ignored), requests_per_unit or an invalid unit beside
	// unlimited: true (ignored), shadow_mode in a rate_limit (ignored: the
	// reference knows it only on descriptors), a rate limit without
	// requests_per_unit (0: every request denied), and a document after
	// the first of a file that does not load or defines a domain already
	// defined (skipped; the reference reads only the first document of a
	// file, envoy-rls all of them).
	Lenient bool
	// OrderFree also refuses a configuration in which one quota bucket
	// (an RLQS BucketId, which has no key order) could select two
	// descriptors, at least one with limits, by walking their keys in
	// different orders (see CheckOrderFree and Domain.MatchBucket).
	OrderFree bool
}

// Load reads the configuration at path with the zero Options: one YAML file,
// or every *.yaml and *.yml file of a directory (not its subdirectories, not
// dotfiles), in name order. The whole configuration is checked; when
// anything is wrong Load returns an Errors holding every problem found.
func Load(path string) (*Config, error) { return LoadWith(path, Options{}) }

// LoadWith reads the configuration at path: one file, or the files of a
// directory that o selects, in path order. A file may hold several YAML
// documents (separated by ---), one domain each.
func LoadWith(path string, o Options) (*Config, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, Errors{{File: path, Reason: "cannot read: " + pathReason(err)}}
	}
	files := []string{path}
	if info.IsDir() {
		if files, _, err = SelectFiles(path, o); err != nil {
			return nil, Errors{{File: path, Reason: "cannot read: " + pathReason(err)}}
		}
		if len(files) == 0 {
			what := "no *.yaml or *.yml files in directory"
			if o.AllFiles {
				what = "no files in directory"
			}
			return nil, Errors{{File: path, Reason: what}}
		}
	}
	var (
		domains []*Domain
		errs    Errors
		warns   Errors
	)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, &Error{File: f, Reason: "cannot read: " + pathReason(err)})
			continue
		}
		ds, es, ws := parseFile(f, data, o.Lenient)
		errs = append(errs, es...)
		warns = append(warns, ws...)
		domains = append(domains, ds...)
	}
	return build(domains, errs, warns, o)
}

// Parse reads one configuration file's contents; file names it in errors.
func Parse(file string, data []byte) (*Config, error) {
	ds, errs, _ := parseFile(file, data, false)
	return build(ds, errs, nil, Options{})
}

// Document is one configuration document and the name its errors carry.
type Document struct {
	File string
	Data []byte
}

// ParseDocuments reads several documents, one domain each, as one
// configuration, with the same checks as Load on a directory (domains must be
// unique). No documents make an empty, valid configuration: a control plane
// may send an empty state of the world.
//
// Deprecated: nothing in this module calls it; use
// ParseDocumentsWith(docs, Options{}).
func ParseDocuments(docs []Document) (*Config, error) {
	return ParseDocumentsWith(docs, Options{})
}

// ParseDocumentsWith is ParseDocuments where o.MergeDomains lets several
// documents define one domain and o.Lenient accepts what the reference
// accepts (the other options select files and do not apply).
func ParseDocumentsWith(docs []Document, o Options) (*Config, error) {
	var (
		domains []*Domain
		errs    Errors
		warns   Errors
	)
	for _, doc := range docs {
		ds, es, ws := parseFile(doc.File, doc.Data, o.Lenient)
		errs = append(errs, es...)
		warns = append(warns, ws...)
		domains = append(domains, ds...)
	}
	return build(domains, errs, warns, o)
}

// Skipped is an entry of a config directory that SelectFiles does not read,
// and why.
type Skipped struct {
	Path   string
	Reason string
	// Option is the Options field that would read it ("Recursive",
	// "AllFiles", "Dotfiles"), "" when none would.
	Option string
}

// The reasons of Skipped.
const (
	SkipAtomicWriter = "Kubernetes' atomic writer entry (..data, ..<timestamp>): it repeats the visible files"
	SkipDotfile      = "name starts with \".\""
	SkipDirectory    = "a subdirectory"
	SkipExtension    = "not *.yaml or *.yml"
	SkipDirLink      = "a link to a directory (not followed)"
	SkipNotRegular   = "not a regular file (a socket, device or pipe)"
)

// SelectFiles lists the configuration files of directory dir that o
// selects, sorted by path, and every entry it does not read with why: the
// one selection LoadWith makes, for a config checker to show. A link to a
// regular file is read as the file; a link to nothing is an error.
func SelectFiles(dir string, o Options) (files []string, skipped []Skipped, err error) {
	err = selectFiles(dir, o, &files, &skipped)
	return files, skipped, err
}

func selectFiles(dir string, o Options, files *[]string, skipped *[]Skipped) error {
	entries, err := os.ReadDir(dir) // sorted by name
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		full := filepath.Join(dir, name)
		skip := func(reason, option string) {
			*skipped = append(*skipped, Skipped{Path: full, Reason: reason, Option: option})
		}
		switch {
		case strings.HasPrefix(name, ".."):
			skip(SkipAtomicWriter, "")
			continue
		case !o.Dotfiles && strings.HasPrefix(name, "."):
			skip(SkipDotfile, "Dotfiles")
			continue
		}
		if e.IsDir() {
			if !o.Recursive {
				skip(SkipDirectory, "Recursive")
				continue
			}
			if err := selectFiles(full, o, files, skipped); err != nil {
				return err
			}
			continue
		}
		if ext := filepath.Ext(name); !o.AllFiles && ext != ".yaml" && ext != ".yml" {
			skip(SkipExtension, "AllFiles")
			continue
		}
		if e.Type()&fs.ModeSymlink != 0 { // follow links to files only
			info, err := os.Stat(full)
			if err != nil {
				return err
			}
			if info.IsDir() {
				skip(SkipDirLink, "")
				continue
			}
			if !info.Mode().IsRegular() {
				skip(SkipNotRegular, "")
				continue
			}
		} else if !e.Type().IsRegular() {
			skip(SkipNotRegular, "") // sockets, devices, pipes
			continue
		}
		*files = append(*files, full)
	}
	return nil
}

// pathReason is the reason of a file system error without the path, which
// the Error already carries.
func pathReason(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// build checks that domain names are unique (or merges their definitions)
// and assembles the Config. When o.Lenient, a later document of a file
// that would make a duplicate domain or a merge conflict is skipped with a
// warning instead, as the reference does not read it.
func build(domains []*Domain, errs, warns Errors, o Options) (*Config, error) {
	c := &Config{domains: make(map[string]*Domain, len(domains))}
	for _, d := range domains {
		first, ok := c.domains[d.Name]
		var es Errors
		switch {
		case !ok:
			c.domains[d.Name] = d
			c.names = append(c.names, d.Name)
		case o.MergeDomains:
			if es = first.conflicts(d); len(es) == 0 {
				first.merge(d)
			}
		default:
			es = Errors{{File: d.File, Line: d.Line,
				Reason: fmt.Sprintf("duplicate domain %q (also defined at %s:%d)", d.Name, first.File, first.Line)}}
		}
		if o.Lenient && d.doc > 1 {
			warns = append(warns, skipped(d.doc, es, "it")...)
		} else {
			errs = append(errs, es...)
		}
	}
	if len(errs) == 0 && o.OrderFree {
		errs = CheckOrderFree(c)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	sort.Strings(c.names)
	sort.SliceStable(warns, func(i, j int) bool {
		if warns[i].File != warns[j].File {
			return warns[i].File < warns[j].File
		}
		return warns[i].Line < warns[j].Line
	})
	c.warnings = warns
	return c, nil
}

// conflicts lists the top-level descriptors of another definition of the
// domain that it defines already (a key and value both define), which
// MERGE_DOMAIN_CONFIG refuses (nested descriptors are not merged).
func (d *Domain) conflicts(other *Domain) Errors {
	var errs Errors
	for _, n := range other.topNodes() {
		if prev := d.root.find(n.Key, n.Value); prev != nil {
			errs = append(errs, &Error{File: other.File, Line: n.Line,
				Reason: fmt.Sprintf("domain %q: descriptor %s is also defined at %s:%d", d.Name, entryName(n.Key, n.Value), d.fileOf(prev), prev.Line)})
		}
	}
	return errs
}

// merge adds the top-level descriptors of another definition of the domain,
// as the reference server's MERGE_DOMAIN_CONFIG does; the caller checked
// that they do not conflict.
func (d *Domain) merge(other *Domain) {
	if d.root == nil {
		d.root = level{}
	}
	for _, n := range other.topNodes() {
		d.root.add(n)
		if d.files == nil {
			d.files = map[*Node]string{}
		}
		d.files[n] = other.File
	}
}

// topNodes returns the top-level nodes of the domain in file order.
func (d *Domain) topNodes() []*Node {
	var ns []*Node
	for _, g := range d.root {
		ns = append(ns, g.nodes()...)
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i].Line < ns[j].Line })
	return ns
}

// fileOf returns the file that defined a top-level node.
func (d *Domain) fileOf(n *Node) string {
	if f, ok := d.files[n]; ok {
		return f
	}
	return d.File
}

// NodeFile returns the file that defines n, a node of the domain: d.File,
// or another file when several were merged (MergeDomains).
func (d *Domain) NodeFile(n *Node) string {
	for n.parent != nil {
		n = n.parent
	}
	return d.fileOf(n)
}

func entryName(key, value string) string {
	if value == "" {
		return fmt.Sprintf("with key %q and no value", key)
	}
	return fmt.Sprintf("with key %q and value %q", key, value)
}

// nodes returns the nodes of a key group.
func (g *keyGroup) nodes() []*Node {
	var ns []*Node
	if g.def != nil {
		ns = append(ns, g.def)
	}
	for _, n := range g.exact {
		ns = append(ns, n)
	}
	return append(ns, g.wild...)
}

// find returns the node of the level with exactly this key and value.
func (l level) find(key, value string) *Node {
	g := l[key]
	if g == nil {
		return nil
	}
	if value == "" {
		return g.def
	}
	if n := g.exact[value]; n != nil {
		return n
	}
	for _, n := range g.wild {
		if n.Value == value {
			return n
		}
	}
	return nil
}

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
		if files, err = configFiles(path, o); err != nil {
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
	)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, &Error{File: f, Reason: "cannot read: " + pathReason(err)})
			continue
		}
		ds, es := parseFile(f, data)
		errs = append(errs, es...)
		domains = append(domains, ds...)
	}
	return build(domains, errs, o.MergeDomains)
}

// Parse reads one configuration file's contents; file names it in errors.
func Parse(file string, data []byte) (*Config, error) {
	ds, errs := parseFile(file, data)
	return build(ds, errs, false)
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
func ParseDocuments(docs []Document) (*Config, error) {
	return ParseDocumentsWith(docs, Options{})
}

// ParseDocumentsWith is ParseDocuments where o.MergeDomains lets several
// documents define one domain (the other options select files and do not
// apply).
func ParseDocumentsWith(docs []Document, o Options) (*Config, error) {
	var (
		domains []*Domain
		errs    Errors
	)
	for _, doc := range docs {
		ds, es := parseFile(doc.File, doc.Data)
		errs = append(errs, es...)
		domains = append(domains, ds...)
	}
	return build(domains, errs, o.MergeDomains)
}

// configFiles lists the configuration files of a directory that o selects,
// sorted by path.
func configFiles(dir string, o Options) ([]string, error) {
	entries, err := os.ReadDir(dir) // sorted by name
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, "..") || (!o.Dotfiles && strings.HasPrefix(name, ".")) {
			continue
		}
		full := filepath.Join(dir, name)
		if e.IsDir() {
			if o.Recursive {
				sub, err := configFiles(full, o)
				if err != nil {
					return nil, err
				}
				files = append(files, sub...)
			}
			continue
		}
		if ext := filepath.Ext(name); !o.AllFiles && ext != ".yaml" && ext != ".yml" {
			continue
		}
		if e.Type()&fs.ModeSymlink != 0 { // follow links to files only
			info, err := os.Stat(full)
			if err != nil {
				return nil, err
			}
			if info.IsDir() {
				continue
			}
		} else if !e.Type().IsRegular() {
			continue // sockets, devices, pipes
		}
		files = append(files, full)
	}
	return files, nil
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
// and assembles the Config.
func build(domains []*Domain, errs Errors, merge bool) (*Config, error) {
	c := &Config{domains: make(map[string]*Domain, len(domains))}
	for _, d := range domains {
		first, ok := c.domains[d.Name]
		switch {
		case !ok:
			c.domains[d.Name] = d
			c.names = append(c.names, d.Name)
		case merge:
			errs = append(errs, first.merge(d)...)
		default:
			errs = append(errs, &Error{File: d.File, Line: d.Line,
				Reason: fmt.Sprintf("duplicate domain %q (also defined at %s:%d)", d.Name, first.File, first.Line)})
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	sort.Strings(c.names)
	return c, nil
}

// merge adds the top-level descriptors of another definition of the domain,
// as the reference server's MERGE_DOMAIN_CONFIG does: a key and value that
// both define is an error (nested descriptors are not merged).
func (d *Domain) merge(other *Domain) Errors {
	var errs Errors
	if d.root == nil {
		d.root = level{}
	}
	var added []*Node
	for _, g := range other.root {
		added = append(added, g.nodes()...)
	}
	sort.Slice(added, func(i, j int) bool { return added[i].Line < added[j].Line })
	for _, n := range added {
		if prev := d.root.find(n.Key, n.Value); prev != nil {
			errs = append(errs, &Error{File: other.File, Line: n.Line,
				Reason: fmt.Sprintf("domain %q: descriptor %s is also defined at %s:%d", d.Name, entryName(n.Key, n.Value), d.fileOf(prev), prev.Line)})
			continue
		}
		d.root.add(n)
		if d.files == nil {
			d.files = map[*Node]string{}
		}
		d.files[n] = other.File
	}
	return errs
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

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

// Load reads the configuration at path: one YAML file, or every *.yaml and
// *.yml file of a directory (not its subdirectories, not dotfiles), in name
// order, one domain per file. The whole configuration is checked; when
// anything is wrong Load returns an Errors holding every problem found.
func Load(path string) (*Config, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, Errors{{File: path, Reason: "cannot read: " + pathReason(err)}}
	}
	files := []string{path}
	if info.IsDir() {
		if files, err = configFiles(path); err != nil {
			return nil, Errors{{File: path, Reason: "cannot read: " + pathReason(err)}}
		}
		if len(files) == 0 {
			return nil, Errors{{File: path, Reason: "no *.yaml or *.yml files in directory"}}
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
		d, es := parseFile(f, data)
		errs = append(errs, es...)
		if d != nil {
			domains = append(domains, d)
		}
	}
	return build(domains, errs)
}

// Parse reads one configuration document; file names it in errors.
func Parse(file string, data []byte) (*Config, error) {
	d, errs := parseFile(file, data)
	var domains []*Domain
	if d != nil {
		domains = append(domains, d)
	}
	return build(domains, errs)
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
	var (
		domains []*Domain
		errs    Errors
	)
	for _, doc := range docs {
		d, es := parseFile(doc.File, doc.Data)
		errs = append(errs, es...)
		if d != nil {
			domains = append(domains, d)
		}
	}
	return build(domains, errs)
}

// configFiles lists the configuration files of a directory, sorted.
func configFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir) // sorted by name
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		ext := filepath.Ext(name)
		if strings.HasPrefix(name, ".") || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		full := filepath.Join(dir, name)
		if e.Type()&fs.ModeSymlink != 0 { // follow links to files
			info, err := os.Stat(full)
			if err != nil {
				return nil, err
			}
			if info.IsDir() {
				continue
			}
		} else if e.IsDir() {
			continue
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

// build checks that domain names are unique and assembles the Config.
func build(domains []*Domain, errs Errors) (*Config, error) {
	c := &Config{domains: make(map[string]*Domain, len(domains))}
	for _, d := range domains {
		if first, ok := c.domains[d.Name]; ok {
			errs = append(errs, &Error{File: d.File, Line: d.Line,
				Reason: fmt.Sprintf("duplicate domain %q (also defined at %s:%d)", d.Name, first.File, first.Line)})
			continue
		}
		c.domains[d.Name] = d
		c.names = append(c.names, d.Name)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	sort.Strings(c.names)
	return c, nil
}

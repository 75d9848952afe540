package xdsconfig

import (
	"fmt"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// TypeURL is the xDS resource type of a rate limit configuration.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Convert turns the resources of one state-of-the-world response into a
// configuration. Every resource becomes one document that goes through the
// same parser and checks as a YAML file, so a config is valid over xDS
// exactly when the same config as a file is; errors name the resource.
// No resources make an empty configuration.
func Convert(resources []*anypb.Any) (*descriptors.Config, error) {
	return ConvertWith(resources, descriptors.Options{})
}

// ConvertWith is Convert with the loader's options (o.MergeDomains lets
// several resources define one domain).
func ConvertWith(resources []*anypb.Any, o descriptors.Options) (*descriptors.Config, error) {
	docs := make([]descriptors.Document, 0, len(resources))
	for i, r := range resources {
		if r.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("resource %d has type %q, want %q", i, r.GetTypeUrl(), TypeURL)
		}
		var c rlsconf.RateLimitConfig
		if err := r.UnmarshalTo(&c); err != nil {
			return nil, fmt.Errorf("resource %d: %v", i, err)
		}
		doc, err := Document(&c)
		if err != nil {
			return nil, err
		}
		docs = append(docs, doc)
	}
	return descriptors.ParseDocumentsWith(docs, o)
}

// Document renders one RateLimitConfig as the YAML document a file would
// hold. Its File is `xds:` and the resource name (the domain when unnamed);
// error lines count in that rendering, which the NACK message explains.
func Document(c *rlsconf.RateLimitConfig) (descriptors.Document, error) {
	name := c.GetName()
	if name == "" {
		name = c.GetDomain()
	}
	top := yamlConfig{Domain: c.GetDomain()}
	for _, d := range c.GetDescriptors() {
		top.Descriptors = append(top.Descriptors, descriptorOf(d))
	}
	data, err := yaml.Marshal(&top)
	if err != nil {
		return descriptors.Document{}, fmt.Errorf("resource %q: %v", name, err)
	}
	return descriptors.Document{File: "xds:" + name, Data: data}, nil
}

type yamlConfig struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value,omitempty"`
	RateLimit      *yamlLimit       `yaml:"rate_limit,omitempty"`
	ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
	DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
	QuotaMode      bool             `yaml:"quota_mode,omitempty"`
	Metadata       map[string]any   `yaml:"metadata,omitempty"`
	Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
}

type yamlLimit struct {
	Unit            string        `yaml:"unit,omitempty"`
	RequestsPerUnit *uint32       `yaml:"requests_per_unit,omitempty"`
	Unlimited       bool          `yaml:"unlimited,omitempty"`
	Name            string        `yaml:"name,omitempty"`
	Replaces        []yamlReplace `yaml:"replaces,omitempty"`
}

type yamlReplace struct {
	Name string `yaml:"name"`
}

func descriptorOf(d *rlsconf.RateLimitDescriptor) yamlDescriptor {
	y := yamlDescriptor{
		Key:            d.GetKey(),
		Value:          d.GetValue(),
		ShadowMode:     d.GetShadowMode(),
		DetailedMetric: d.GetDetailedMetric(),
		QuotaMode:      d.GetQuotaMode(),
	}
	if m := d.GetMetadata(); m != nil {
		y.Metadata = m.AsMap()
	}
	if p := d.GetRateLimit(); p != nil {
		l := &yamlLimit{Unlimited: p.GetUnlimited(), Name: p.GetName()}
		// UNKNOWN is the proto's "not set": the parser then asks for a
		// unit, as the reference server does. A number outside the enum
		// shows as its number and is refused as an invalid unit.
		if u := p.GetUnit(); u != rlsconf.RateLimitUnit_UNKNOWN {
			l.Unit = u.String()
		}
		if !l.Unlimited {
			n := p.GetRequestsPerUnit()
			l.RequestsPerUnit = &n
		}
		for _, r := range p.GetReplaces() {
			l.Replaces = append(l.Replaces, yamlReplace{Name: r.GetName()})
		}
		y.RateLimit = l
	}
	for _, c := range d.GetDescriptors() {
		y.Descriptors = append(y.Descriptors, descriptorOf(c))
	}
	return y
}

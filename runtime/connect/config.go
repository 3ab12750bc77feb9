package connect

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Config is a connector or task configuration. Every value is a string, as
// in Kafka Connect's REST API.
type Config map[string]string

// Clone returns a copy of c.
func (c Config) Clone() Config {
	out := make(Config, len(c))
	for k, v := range c {
		out[k] = v
	}
	return out
}

// String returns the value of key, or "" when it is absent.
func (c Config) String(key string) string { return c[key] }

// Int parses the value of key as an integer; def is returned when the key is
// absent or empty.
func (c Config) Int(key string, def int) (int, error) {
	v := strings.TrimSpace(c[key])
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not an integer", key, v)
	}
	return n, nil
}

// Bool parses the value of key as a boolean; def is returned when the key is
// absent or empty.
func (c Config) Bool(key string, def bool) (bool, error) {
	v := strings.TrimSpace(c[key])
	if v == "" {
		return def, nil
	}
	switch strings.ToLower(v) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("%s: %q is not a boolean (true or false)", key, v)
}

// List splits the value of key on commas, trimming spaces and dropping empty
// items.
func (c Config) List(key string) []string { return SplitList(c[key]) }

// SplitList splits a comma-separated list, trimming spaces and dropping empty
// items.
func SplitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// ConfigType is a configuration value's type, named as Kafka Connect names it.
type ConfigType string

const (
	TypeBoolean  ConfigType = "BOOLEAN"
	TypeClass    ConfigType = "CLASS"
	TypeDouble   ConfigType = "DOUBLE"
	TypeInt      ConfigType = "INT"
	TypeList     ConfigType = "LIST"
	TypeLong     ConfigType = "LONG"
	TypePassword ConfigType = "PASSWORD"
	TypeShort    ConfigType = "SHORT"
	TypeString   ConfigType = "STRING"
)

// Importance is how much a key matters to a user, as Kafka Connect says it.
type Importance string

const (
	ImportanceHigh   Importance = "HIGH"
	ImportanceMedium Importance = "MEDIUM"
	ImportanceLow    Importance = "LOW"
)

// Width is the display width hint of Kafka Connect's config definitions.
type Width string

const (
	WidthNone   Width = "NONE"
	WidthShort  Width = "SHORT"
	WidthMedium Width = "MEDIUM"
	WidthLong   Width = "LONG"
)

// ConfigKey defines one configuration key.
type ConfigKey struct {
	Name string
	Type ConfigType
	// Default is used when the key is absent. A key with Required set has no
	// default.
	Default  string
	Required bool
	Doc      string
	// Group, DisplayName, Importance, Width and Order are display hints for
	// the REST config endpoints.
	Group       string
	DisplayName string
	Importance  Importance
	Width       Width
	Order       int
	// Secret marks a value that must never be logged or shown: PASSWORD
	// values are always secret; a secret STRING (a URL or DSN) has its
	// credentials masked (see MaskCredentials).
	Secret bool
	// Recommended lists suggested values.
	Recommended []string
	// Validate checks a present, well-typed value and says what to fix.
	Validate func(value string) error
}

// ConfigDef is a connector's set of configuration keys.
type ConfigDef []ConfigKey

// Key returns the definition of name.
func (d ConfigDef) Key(name string) (ConfigKey, bool) {
	i := slices.IndexFunc(d, func(k ConfigKey) bool { return k.Name == name })
	if i < 0 {
		return ConfigKey{}, false
	}
	return d[i], true
}

// Merge returns d followed by the keys of other that d does not define.
func (d ConfigDef) Merge(other ConfigDef) ConfigDef {
	out := slices.Clone(d)
	for _, k := range other {
		if _, ok := d.Key(k.Name); !ok {
			out = append(out, k)
		}
	}
	return out
}

// WithDefaults returns a copy of cfg with defaults filled in for absent keys.
func (d ConfigDef) WithDefaults(cfg Config) Config {
	out := cfg.Clone()
	for _, k := range d {
		if _, ok := out[k.Name]; !ok && !k.Required && k.Default != "" {
			out[k.Name] = k.Default
		}
	}
	return out
}

// Validate checks cfg against the definition and returns the error messages
// per key; an empty map means valid. Keys the definition does not know are
// ignored, as Kafka Connect ignores them.
func (d ConfigDef) Validate(cfg Config) map[string][]string {
	errs := map[string][]string{}
	for _, k := range d {
		v, present := cfg[k.Name]
		if !present || strings.TrimSpace(v) == "" {
			switch {
			case k.Required:
				errs[k.Name] = append(errs[k.Name], fmt.Sprintf("Missing required configuration %q which has no default value.", k.Name))
			case present && (k.Type == TypeInt || k.Type == TypeShort || k.Type == TypeLong || k.Type == TypeDouble || k.Type == TypeBoolean):
				// As in Kafka Connect: a number or boolean that is present
				// must parse; blank does not silently mean the default.
				errs[k.Name] = append(errs[k.Name], fmt.Sprintf("Invalid value %q for configuration %s: %v (leave the key out for the default%s)", v, k.Name, checkType(k.Type, v), defaultHint(k)))
			}
			continue
		}
		if err := checkType(k.Type, v); err != nil {
			errs[k.Name] = append(errs[k.Name], fmt.Sprintf("Invalid value %s for configuration %s: %v", displayValue(k, v), k.Name, err))
			continue
		}
		if k.Validate != nil {
			if err := k.Validate(v); err != nil {
				errs[k.Name] = append(errs[k.Name], fmt.Sprintf("Invalid value %s for configuration %s: %v", displayValue(k, v), k.Name, err))
			}
		}
	}
	return errs
}

func defaultHint(k ConfigKey) string {
	if k.Default == "" {
		return ""
	}
	return ", " + k.Default
}

func displayValue(k ConfigKey, v string) string {
	if k.Type == TypePassword {
		return HiddenValue
	}
	if k.Secret {
		return MaskCredentials(v)
	}
	return v
}

func checkType(t ConfigType, v string) error {
	v = strings.TrimSpace(v)
	var err error
	switch t {
	case TypeInt:
		_, err = strconv.ParseInt(v, 10, 32)
	case TypeShort:
		_, err = strconv.ParseInt(v, 10, 16)
	case TypeLong:
		_, err = strconv.ParseInt(v, 10, 64)
	case TypeDouble:
		_, err = strconv.ParseFloat(v, 64)
	case TypeBoolean:
		if l := strings.ToLower(v); l != "true" && l != "false" {
			return fmt.Errorf("expected a boolean (true or false)")
		}
	}
	if err != nil {
		return fmt.Errorf("expected %s", strings.ToLower(string(t)))
	}
	return nil
}

// HiddenValue replaces a PASSWORD value in any output, as Kafka Connect does.
const HiddenValue = "[hidden]"

// Mask returns a copy of cfg safe to show or log: PASSWORD values are
// replaced by HiddenValue, credentials in secret values are masked, and so
// are values of unknown keys whose names say they hold a secret.
func (d ConfigDef) Mask(cfg Config) Config {
	out := make(Config, len(cfg))
	for name, v := range cfg {
		k, known := d.Key(name)
		switch {
		case known && k.Type == TypePassword:
			out[name] = HiddenValue
		case known && k.Secret:
			out[name] = MaskCredentials(v)
		case !known && looksSecret(name):
			out[name] = HiddenValue
		default:
			out[name] = MaskCredentials(v)
		}
	}
	return out
}

func looksSecret(name string) bool {
	n := strings.ToLower(name)
	return strings.HasSuffix(n, "password") || strings.HasSuffix(n, ".secret") || strings.Contains(n, "secret.key")
}

// MaskedPassword stands for a password inside a masked URL or DSN.
const MaskedPassword = "xxxxx"

// dsnPassword finds password and sslpassword (the client key's passphrase)
// in a key=value DSN; uriPassword finds them among a URL's query parameters.
// In an unquoted DSN value, as in a quoted one, libpq and pgx read a
// backslash as escaping the next character, a space included
// (password=top\ secret is "top secret").
// dsnValueOpen matches text that ends inside a DSN password value: a "://"
// after it belongs to the password, not to a URL.
var (
	dsnPassword  = regexp.MustCompile(`(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|(?:[^\s\\]|\\[\s\S]?)+)`)
	dsnValueOpen = regexp.MustCompile(`(?i)\b(?:ssl)?password\s*=\s*(?:'(?:[^'\\]|\\[\s\S])*|(?:[^\s\\]|\\[\s\S])*)$`)
	uriPassword  = regexp.MustCompile(`(?i)([?&](?:ssl)?password=)([^&\s]*)`)
)

// MaskCredentials hides the passwords in a URL (scheme://user:pass@host, and
// password or sslpassword query parameters) or a key=value DSN (password=...,
// sslpassword=...). Other strings are returned unchanged.
//
// It does not parse the URL: libpq (and pgx) take the user part up to the
// first '@' before the first '/', so a password may hold '#', '?' or a
// stray '%' that net/url refuses or reads otherwise, and the URL still
// connects. Whatever precedes the last '@' before the first '/' after the
// scheme is taken as user info (or, without one there, what precedes the
// first '@'), which masks at least the password under either reading.
func MaskCredentials(s string) string {
	i := strings.Index(s, "://")
	if i < 0 || dsnValueOpen.MatchString(s[:i]) {
		return dsnPassword.ReplaceAllString(s, "${1}"+MaskedPassword)
	}
	head, rest := s[:i+3], s[i+3:]
	authority := rest
	if j := strings.IndexByte(rest, '/'); j >= 0 {
		authority = rest[:j]
	}
	at := strings.LastIndexByte(authority, '@')
	if q := strings.IndexByte(rest, '?'); at < 0 && (q < 0 || strings.IndexByte(rest, '@') < q) {
		// A '/' in the password: not a URL libpq can use, but its
		// error messages would still quote it. An '@' only in the query
		// (user=alice@corp) is no user part.
		at = strings.IndexByte(rest, '@')
	}
	if at >= 0 {
		if colon := strings.IndexByte(rest[:at], ':'); colon >= 0 {
			rest = rest[:colon+1] + MaskedPassword + rest[at:]
		}
	}
	return head + uriPassword.ReplaceAllString(rest, "${1}"+MaskedPassword)
}

// Unmask returns update with masked values replaced by the stored values
// they stand for, so a client that reads a masked config and writes it back
// does not overwrite the secret with the mask.
func (d ConfigDef) Unmask(update, stored Config) Config {
	out := update.Clone()
	masked := d.Mask(stored)
	for name, v := range update {
		if old, ok := stored[name]; ok && v != old && v == masked[name] {
			out[name] = old
		}
	}
	return out
}

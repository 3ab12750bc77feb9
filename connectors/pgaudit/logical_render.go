package pgaudit

import (
	"strings"
)

// The task renders the values of the most common built-in types itself,
// byte for byte as to_json renders them in its session (ISO dates in UTC,
// exact floats, hex bytea): rendering every change in the database took
// a statement per Poll, and its CPU was the server's, which the writers
// share. A value of any other type (a domain counts as its base type) is
// rendered by the server, with the rest of its image.
// TestLogicalRenderMatchesToJSON compares the two on each type.

// How a type's text value becomes JSON.
type renderKind int8

const (
	renderServer   renderKind = iota // not known here: the server renders the image
	renderString                     // a JSON string of the text
	renderNumber                     // a number, or a string if not a valid JSON number (NaN, Infinity)
	renderBool                       // t / f
	renderRaw                        // json, jsonb: the text is JSON
	renderDateTime                   // timestamp(tz): ISO text to to_json's XSD form
	renderDate                       // date: the same text unless infinite or BC
)

// renderKinds of built-in scalar types by OID.
var renderKinds = map[uint32]renderKind{
	16:   renderBool,     // bool
	17:   renderString,   // bytea (hex)
	18:   renderString,   // "char"
	19:   renderString,   // name
	20:   renderNumber,   // int8
	21:   renderNumber,   // int2
	23:   renderNumber,   // int4
	25:   renderString,   // text
	114:  renderRaw,      // json
	700:  renderNumber,   // float4
	701:  renderNumber,   // float8
	1042: renderString,   // bpchar
	1043: renderString,   // varchar
	1082: renderDate,     // date
	1083: renderString,   // time
	1114: renderDateTime, // timestamp
	1184: renderDateTime, // timestamptz
	1186: renderString,   // interval
	1266: renderString,   // timetz
	1700: renderNumber,   // numeric
	2950: renderString,   // uuid
	3802: renderRaw,      // jsonb
}

// arrayElements of built-in array types by OID: their element type.
var arrayElementTypes = map[uint32]uint32{
	1000: 16, 1001: 17, 1003: 19, 1016: 20, 1005: 21, 1007: 23, 1009: 25, 199: 114,
	1021: 700, 1022: 701, 1014: 1042, 1015: 1043, 1182: 1082, 1183: 1083, 1115: 1114,
	1185: 1184, 1187: 1186, 1270: 1266, 1231: 1700, 2951: 2950, 3807: 3802,
}

// renderable reports whether values of base type oid are rendered here.
func renderable(oid uint32) bool {
	if _, ok := renderKinds[oid]; ok {
		return true
	}
	_, ok := arrayElementTypes[oid]
	return ok
}

// appendValue appends the JSON of text value v of base type oid; false
// when only the server can render it (then out is not to be used).
func appendValue(out []byte, oid uint32, v string) ([]byte, bool) {
	if elem, ok := arrayElementTypes[oid]; ok {
		return appendArrayValue(out, elem, v)
	}
	switch renderKinds[oid] {
	case renderString:
		return appendPGString(out, v), true
	case renderNumber:
		if validJSONNumber(v) {
			return append(out, v...), true
		}
		return appendPGString(out, v), true
	case renderBool:
		switch v {
		case "t":
			return append(out, "true"...), true
		case "f":
			return append(out, "false"...), true
		}
	case renderRaw:
		return append(out, v...), true
	case renderDate:
		if isPlainDate(v) {
			return appendPGString(out, v), true
		}
	case renderDateTime:
		// "2026-01-02 03:04:05.5+00" -> "2026-01-02T03:04:05.5+00:00"
		if len(v) < 19 || !isPlainDate(v[:10]) || v[10] != ' ' || strings.Contains(v, "BC") {
			return out, false
		}
		out = append(out, '"')
		out = append(out, v[:10]...)
		out = append(out, 'T')
		rest := v[11:]
		if i := strings.IndexAny(rest, "+-"); i >= 0 {
			out = append(out, rest[:i]...)
			zone := rest[i:]
			out = append(out, zone...)
			if !strings.Contains(zone, ":") {
				out = append(out, ":00"...)
			}
		} else {
			out = append(out, rest...)
		}
		return append(out, '"'), true
	}
	return out, false
}

// isPlainDate: YYYY-MM-DD (4-digit year, AD), which to_json writes as it is.
func isPlainDate(v string) bool {
	if len(v) != 10 || v[4] != '-' || v[7] != '-' {
		return false
	}
	for i, c := range []byte(v) {
		if i != 4 && i != 7 && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// appendArrayValue renders a one-dimensional array literal with default
// bounds ({a,"b c",NULL}) as to_json does; anything else is the server's.
func appendArrayValue(out []byte, elem uint32, v string) ([]byte, bool) {
	if len(v) < 2 || v[0] != '{' || v[len(v)-1] != '}' {
		return out, false
	}
	body := v[1 : len(v)-1]
	out = append(out, '[')
	if body == "" {
		return append(out, ']'), true
	}
	first := true
	for len(body) > 0 {
		var item string
		quoted := false
		if body[0] == '"' {
			var b strings.Builder
			i := 1
			for ; i < len(body) && body[i] != '"'; i++ {
				if body[i] == '\\' && i+1 < len(body) {
					i++
				}
				b.WriteByte(body[i])
			}
			if i >= len(body) {
				return out, false
			}
			item, quoted = b.String(), true
			body = body[i+1:]
		} else {
			if body[0] == '{' {
				return out, false // more than one dimension
			}
			i := strings.IndexByte(body, ',')
			if i < 0 {
				i = len(body)
			}
			item, body = body[:i], body[i:]
		}
		if len(body) > 0 {
			if body[0] != ',' {
				return out, false
			}
			body = body[1:]
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		if !quoted && item == "NULL" {
			out = append(out, "null"...)
			continue
		}
		var ok bool
		if out, ok = appendValue(out, elem, item); !ok {
			return out, false
		}
	}
	return append(out, ']'), true
}

// appendPGString appends s as a JSON string escaped as PostgreSQL's
// escape_json does (only '"', '\\' and control characters).
func appendPGString(out []byte, s string) []byte {
	out = append(out, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '\b':
			out = append(out, `\b`...)
		case '\f':
			out = append(out, `\f`...)
		case '\n':
			out = append(out, `\n`...)
		case '\r':
			out = append(out, `\r`...)
		case '\t':
			out = append(out, `\t`...)
		case '"':
			out = append(out, `\"`...)
		case '\\':
			out = append(out, `\\`...)
		default:
			if c < ' ' {
				const hex = "0123456789abcdef"
				out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			} else {
				out = append(out, c)
			}
		}
	}
	return append(out, '"')
}

// validJSONNumber is PostgreSQL's IsValidJsonNumber: -?int(.digits)?(e[+-]?digits)?
// with no leading zeros but a lone one.
func validJSONNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	start := i
	n := digits()
	if n == 0 || (n > 1 && s[start] == '0') {
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}

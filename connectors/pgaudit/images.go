package pgaudit

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Row images are stored in PostgreSQL's binary formats (record_send for one
// row, array_send for a group of rows) and turned into JSON by PostgreSQL
// itself when the task reads them: the task sends them back as a binary
// parameter of the table's row type and selects to_json of each element
// (docs/decisions/0044). The writer never pays for JSON, and the JSON is
// exactly to_json's.

// arrayElements splits a one-dimensional array_send image into its
// elements' binary images.
func arrayElements(b []byte) ([][]byte, error) {
	if len(b) < 12 {
		return nil, fmt.Errorf("array image of %d bytes is too short", len(b))
	}
	ndim := int32(binary.BigEndian.Uint32(b))
	if ndim == 0 {
		return nil, nil
	}
	if ndim != 1 || len(b) < 20 {
		return nil, fmt.Errorf("array image has %d dimensions, want 1", ndim)
	}
	n := int(int32(binary.BigEndian.Uint32(b[12:])))
	if n < 0 {
		return nil, fmt.Errorf("array image has a negative length %d", n)
	}
	out := make([][]byte, 0, n)
	p := 20
	for range n {
		if p+4 > len(b) {
			return nil, errors.New("array image is truncated")
		}
		l := int(int32(binary.BigEndian.Uint32(b[p:])))
		p += 4
		if l < 0 {
			return nil, errors.New("array image holds a NULL row")
		}
		if p+l > len(b) {
			return nil, errors.New("array image is truncated")
		}
		out = append(out, b[p:p+l:p+l])
		p += l
	}
	return out, nil
}

// appendArray appends the array_send form of a one-dimensional array of
// the given element type.
func appendArray(out []byte, elemType uint32, elems [][]byte) []byte {
	out = binary.BigEndian.AppendUint32(out, 1) // dimensions
	out = binary.BigEndian.AppendUint32(out, 0) // no NULLs
	out = binary.BigEndian.AppendUint32(out, elemType)
	out = binary.BigEndian.AppendUint32(out, uint32(len(elems)))
	out = binary.BigEndian.AppendUint32(out, 1) // lower bound
	for _, e := range elems {
		out = binary.BigEndian.AppendUint32(out, uint32(len(e)))
		out = append(out, e...)
	}
	return out
}

// recordColumn is one column of a record_send image: its type and its
// binary value (nil for NULL).
type recordColumn struct {
	oid   uint32
	value []byte
}

func recordColumns(b []byte) ([]recordColumn, error) {
	if len(b) < 4 {
		return nil, errors.New("record image is too short")
	}
	n := int(int32(binary.BigEndian.Uint32(b)))
	if n < 0 {
		return nil, fmt.Errorf("record image has a negative column count %d", n)
	}
	cols := make([]recordColumn, 0, n)
	p := 4
	for range n {
		if p+8 > len(b) {
			return nil, errors.New("record image is truncated")
		}
		c := recordColumn{oid: binary.BigEndian.Uint32(b[p:])}
		l := int(int32(binary.BigEndian.Uint32(b[p+4:])))
		p += 8
		if l >= 0 {
			if p+l > len(b) {
				return nil, errors.New("record image is truncated")
			}
			c.value = b[p : p+l : p+l]
			p += l
		}
		cols = append(cols, c)
	}
	return cols, nil
}

// column is a live column of a captured table, in attribute order.
type column struct {
	name string
	oid  uint32
}

// decodeBatchBytes bounds the images decoded by one statement (a variable
// for tests).
var decodeBatchBytes = 64 << 20

// byteBatches splits imgs, in order, into runs of at most limit bytes (a
// larger image alone).
func byteBatches(imgs [][]byte, limit int) [][][]byte {
	var out [][][]byte
	start, size := 0, 0
	for i, img := range imgs {
		if i > start && size+len(img) > limit {
			out = append(out, imgs[start:i:i])
			start, size = i, 0
		}
		size += len(img)
	}
	if start < len(imgs) {
		out = append(out, imgs[start:])
	}
	return out
}

// decodeRowType returns to_json of each image, in order, decoding all of
// them in one statement as an array of the table's current row type.
// PostgreSQL refuses that (shapeChanged) when the table's columns changed
// since the images were written or the table is gone.
func decodeRowType(ctx context.Context, conn *pgconn.PgConn, m *tableMeta, imgs [][]byte) ([][]byte, error) {
	if m.arrayType == 0 {
		return nil, &pgconn.PgError{Code: "42704", Message: "table " + m.table + " no longer exists"}
	}
	res := conn.ExecParams(ctx, `SELECT pg_catalog.to_json(x.*)::text FROM pg_catalog.unnest($1) AS x`,
		[][]byte{appendArray(nil, m.rowType, imgs)}, []uint32{m.arrayType}, []int16{1}, []int16{0}).Read()
	if res.Err != nil {
		return nil, res.Err
	}
	if len(res.Rows) != len(imgs) {
		return nil, fmt.Errorf("decoding %d row images of %s returned %d rows", len(imgs), m.table, len(res.Rows))
	}
	out := make([][]byte, len(res.Rows))
	for i, r := range res.Rows {
		out[i] = r[0]
	}
	return out, nil
}

// imageError is the error of decoding the image at index of a batch.
type imageError struct {
	index int
	err   error
}

func (e *imageError) Error() string { return e.err.Error() }
func (e *imageError) Unwrap() error { return e.err }

// decodeByColumns decodes each image on its own from the column types it
// carries (see decodeByColumn). An error says which image (imageError).
// excluded are the column.exclude.list columns of the configured table the
// images belong to.
func decodeByColumns(ctx context.Context, conn *pgconn.PgConn, m *tableMeta, excluded map[string]bool, imgs [][]byte) ([][]byte, error) {
	out := make([][]byte, len(imgs))
	for i, img := range imgs {
		j, err := decodeByColumn(ctx, conn, m.columns, m.stable, excluded, img)
		if err != nil {
			return nil, &imageError{i, fmt.Errorf("decoding a change of %s written before its columns changed: %w", m.table, err)}
		}
		out[i] = j
	}
	return out, nil
}

// shapeChanged reports the errors with which record_recv rejects an image
// written before the table's columns changed: the column-by-column path
// reads each value by the type it was written with, and delivers what even
// that cannot read as hex, so no image stops the stream.
func shapeChanged(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch {
	case pe.Code == "42804", // datatype_mismatch: wrong number of columns, wrong data type
		pe.Code == "42704",               // undefined_object: the row type is gone
		strings.HasPrefix(pe.Code, "22"), // data exception: a narrower varchar, a renamed enum label, ...
		strings.HasPrefix(pe.Code, "23"), // integrity: a domain's new CHECK
		strings.HasPrefix(pe.Code, "P0"): // a domain CHECK whose PL/pgSQL function raises
		return true
	case pe.Code == "XX000" && strings.Contains(pe.Message, "cache lookup failed for type"):
		// The row type the task had read is gone: its table (a partition,
		// say) was dropped since.
		return true
	}
	return false
}

// valueRefused reports whether err says a value cannot be read by its
// type (which decodeByColumn then delivers as hex), rather than something
// about the session (a statement timeout, a cancel, a lost connection,
// resources): hex in its place would replace a readable value for good
// once the change is acknowledged and deleted.
func valueRefused(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	if shapeChanged(err) {
		return true
	}
	switch pe.Code[:min(2, len(pe.Code))] {
	case "08", // connection exception
		"25", // invalid transaction state
		"40", // transaction rollback
		"53", // insufficient resources
		"54", // program limit exceeded
		"55", // object not in prerequisite state (a lock not available)
		"57", // operator intervention: statement timeout, cancel, shutdown
		"58", // system error
		"XX": // internal error
		return false
	}
	if pe.Code == "42501" { // insufficient privilege: the same for every value
		return false
	}
	// Anything else comes from the value's receive function or its
	// domain's CHECK (which may call a function that raises).
	return true
}

// maxPairsPerCall bounds the columns rendered by one query (a bound kept
// from when one function call rendered them, with its 100-argument limit).
const maxPairsPerCall = 50

// decodeByColumn builds the JSON object of one record image from the
// column types the image carries. Names come from the table's current
// columns at the same position (see below for which positions still line
// up; stable counts the live columns before the first dropped one); any
// other column is named "_column_<position>", and its value is still
// delivered. A value
// PostgreSQL can no longer read (its type was dropped since) is delivered
// as the hex string of its binary form rather than blocking the stream.
// When an excluded column (column.exclude.list) does not keep its name,
// the values named by position are left out: any of them may be its.
func decodeByColumn(ctx context.Context, conn *pgconn.PgConn, current []column, stable int, excluded map[string]bool, img []byte) ([]byte, error) {
	cols, err := recordColumns(img)
	if err != nil {
		return nil, err
	}
	// When the image's types are those of the table's first columns, no
	// column was dropped since it was written (columns added since come
	// last): every name holds. Otherwise a column was dropped or changed
	// type: only positions before the table's first dropped column still
	// line up; after it, a column of the same type would lend its name to a
	// dropped neighbour's value. Before it, position i is attribute i+1
	// both when the image was written and now (no attribute there was ever
	// dropped, and added ones come last), so the name holds even where the
	// type changed: ALTER COLUMN ... TYPE keeps the attribute. That keeps
	// the key of changes written before the usual int-to-bigint migration
	// of a primary key.
	limit := len(cols)
	for i, c := range cols {
		if i >= len(current) || current[i].oid != c.oid {
			limit = stable
			break
		}
	}
	// A column of the table may itself be called _column_<n>: a second
	// member of that name would hide one of the two values.
	taken := map[string]bool{}
	for _, c := range current {
		if strings.HasPrefix(c.name, "_") {
			taken[c.name] = true
		}
	}
	named := min(limit, len(current), len(cols)) // the leading positions that keep their names
	for ex := range excluded {
		if !slices.ContainsFunc(current[:named], func(c column) bool { return c.name == ex }) {
			// The excluded value may be any of those named by position:
			// envelope, which leaves columns out by name, would miss it.
			cols = cols[:named]
			break
		}
	}
	names := make([]string, len(cols))
	for i := range cols {
		if i < limit && i < len(current) {
			names[i] = current[i].name
			continue
		}
		names[i] = "_column_" + strconv.Itoa(i+1)
		for taken[names[i]] {
			names[i] = "_" + names[i]
		}
	}
	out := []byte{'{'}
	add := func(members []byte) {
		if len(members) == 0 {
			return
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, members...)
	}
	for lo := 0; lo < len(cols); lo += maxPairsPerCall {
		hi := min(lo+maxPairsPerCall, len(cols))
		members, err := buildObjectMembers(ctx, conn, names[lo:hi], cols[lo:hi])
		if err == nil {
			add(members)
			continue
		}
		if !valueRefused(err) {
			return nil, err
		}
		for i := lo; i < hi; i++ {
			members, err := buildObjectMembers(ctx, conn, names[i:i+1], cols[i:i+1])
			if err != nil {
				if !valueRefused(err) {
					return nil, err
				}
				members = appendJSONString(nil, names[i])
				members = append(members, ':')
				if cols[i].value == nil {
					// A NULL stays null, whatever its type now refuses.
					members = append(members, "null"...)
				} else {
					members = appendJSONString(members, `\x`+hex.EncodeToString(cols[i].value))
				}
			}
			add(members)
		}
	}
	return append(out, '}'), nil
}

// buildObjectMembers returns `"name":value,...` for the columns, each value
// read by its own type's binary receive function and rendered by to_json,
// as to_json(row) renders every other image, byte for byte (json_build_object
// would put spaces around the colons).
func buildObjectMembers(ctx context.Context, conn *pgconn.PgConn, names []string, cols []recordColumn) ([]byte, error) {
	var sql strings.Builder
	sql.WriteString(`SELECT `)
	params := make([][]byte, 0, 2*len(cols))
	oids := make([]uint32, 0, 2*len(cols))
	formats := make([]int16, 0, 2*len(cols))
	for i, c := range cols {
		if i > 0 {
			sql.WriteString(` OPERATOR(pg_catalog.||) ',' OPERATOR(pg_catalog.||) `)
		}
		fmt.Fprintf(&sql, "pg_catalog.to_json($%d::pg_catalog.text)::pg_catalog.text OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) COALESCE(pg_catalog.to_json($%d)::pg_catalog.text, 'null')", 2*i+1, 2*i+2)
		params = append(params, []byte(names[i]), c.value)
		oids = append(oids, 25, c.oid) // text, the column's own type
		formats = append(formats, 0, 1)
	}
	res := conn.ExecParams(ctx, sql.String(), params, oids, formats, []int16{0}).Read()
	if res.Err != nil {
		return nil, res.Err
	}
	if len(res.Rows) != 1 {
		return nil, fmt.Errorf("decoding one row image returned %d rows", len(res.Rows))
	}
	members := res.Rows[0][0]
	if len(members) == 0 {
		return nil, errors.New("decoding one row image returned no members")
	}
	return members, nil
}

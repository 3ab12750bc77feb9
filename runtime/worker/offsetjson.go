package worker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// DecodeOffsetJSON decodes a JSON object as source partitions and offsets
// are given back to tasks: a whole number as int64, exactly (Kafka
// Connect's Long: a UnixNano watermark or a large sequence value must not
// be rounded to the nearest float64), any other number as float64, nested
// objects and arrays alike. null decodes to a nil map.
func DecodeOffsetJSON(data []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the JSON object")
	}
	if err := OffsetNumbers(m); err != nil {
		return nil, err
	}
	return m, nil
}

// NormalizeOffset gives m the shape it has after being stored and read
// back (DecodeOffsetJSON), so that an offset read from a cache equals one
// read after a restart.
func NormalizeOffset(m map[string]any) (map[string]any, error) {
	if m == nil {
		return nil, nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("%v cannot be encoded as JSON: %w", m, err)
	}
	return DecodeOffsetJSON(b)
}

// OffsetNumbers replaces, in place, every json.Number in m (decoded with
// UseNumber) by an int64 when it is a whole number that fits, else by a
// float64.
func OffsetNumbers(m map[string]any) error {
	for k, v := range m {
		n, err := offsetNumbers(v)
		if err != nil {
			return err
		}
		m[k] = n
	}
	return nil
}

func offsetNumbers(v any) (any, error) {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i, nil
		}
		f, err := x.Float64()
		if err != nil {
			return nil, fmt.Errorf("number %s: %w", x, err)
		}
		return f, nil
	case map[string]any:
		return x, OffsetNumbers(x)
	case []any:
		for i, e := range x {
			n, err := offsetNumbers(e)
			if err != nil {
				return nil, err
			}
			x[i] = n
		}
		return x, nil
	}
	return v, nil
}

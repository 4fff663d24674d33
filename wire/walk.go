package wire

import "reflect"

// maxDepth bounds how deep WalkStrings descends.
const maxDepth = 64

// WalkStrings calls fn for every string in v, a decoded JSON value such
// as an invocation's arguments: v itself, map values and slice or array
// items, recursively (to a bounded depth). Map keys are not visited.
func WalkStrings(v any, fn func(string)) { walkStrings(v, 0, fn) }

func walkStrings(v any, depth int, fn func(string)) {
	if depth > maxDepth {
		return
	}
	switch v := v.(type) {
	case nil:
		return
	case string:
		fn(v)
		return
	case map[string]any:
		for _, x := range v {
			walkStrings(x, depth+1, fn)
		}
		return
	case []any:
		for _, x := range v {
			walkStrings(x, depth+1, fn)
		}
		return
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.String:
		fn(rv.String())
	case reflect.Map:
		it := rv.MapRange()
		for it.Next() {
			walkStrings(it.Value().Interface(), depth+1, fn)
		}
	case reflect.Slice, reflect.Array:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			return // bytes, not strings
		}
		for i := 0; i < rv.Len(); i++ {
			walkStrings(rv.Index(i).Interface(), depth+1, fn)
		}
	case reflect.Pointer, reflect.Interface:
		if !rv.IsNil() {
			walkStrings(rv.Elem().Interface(), depth+1, fn)
		}
	}
}

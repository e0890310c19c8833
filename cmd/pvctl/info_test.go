package main

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/firmware"
)

// numbered returns a T whose unsigned fields hold 1, 2, 3, ... in order
// and whose bools are true, so that every field's value is its own.
func numbered[T any]() T {
	var s T
	v := reflect.ValueOf(&s).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			f.SetUint(uint64(i + 1))
		case reflect.Bool:
			f.SetBool(true)
		}
	}
	return s
}

// jsonTag is a field's JSON name.
func jsonTag(f reflect.StructField) string {
	tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return tag
}

// checkShown checks that obj shows every JSON-tagged field of s: under its
// tag or its view's key, as its value unless its view gives another form,
// and not at all where its view says "-". It returns the keys it found.
func checkShown(t *testing.T, obj map[string]any, s any, views map[string]view) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	v := reflect.ValueOf(s)
	for i := range v.NumField() {
		f := v.Type().Field(i)
		tag := jsonTag(f)
		if tag == "" {
			continue
		}
		vw := views[tag]
		key := tag
		if vw.key != "" {
			key = vw.key
		}
		if key == "-" {
			assert.NotContains(t, obj, tag, "%s is left out", f.Name)
			continue
		}
		require.Contains(t, obj, key, "%s.%s is shown as %q", v.Type().Name(), f.Name, key)
		seen[key] = true
		want := v.Field(i).Interface()
		if vw.form != nil {
			want = vw.form(v.Field(i))
		}
		b, err := json.Marshal(want)
		require.NoError(t, err)
		var w any
		require.NoError(t, json.Unmarshal(b, &w))
		assert.Equal(t, w, obj[key], "%s.%s", v.Type().Name(), f.Name)
	}
	return seen
}

// info's JSON is made from firmware's structs: every field of Caps,
// PortAttr and Quirks with a JSON tag is in it, under its tag (or the key
// its view gives), with the device's value in the view's form; beside
// them only the keys info adds (bdf, interface_version, transport,
// atomic_cap; a port's number, link layer and GIDs; ports, quirks, srq).
func TestInfoJSONShowsEveryFirmwareFieldUnderItsTag(t *testing.T) {
	d := infoDoc{
		bdf: "0000:00:10.1", vfio: "cdev", version: 20, caps: numbered[firmware.Caps](), port: numbered[firmware.PortAttr](),
		gids: []string{"fe80::1"}, quirks: numbered[firmware.Quirks](), srq: srqInfo{MaxDepth: []int{}},
	}
	d.caps.Mode = firmware.ModeRoCE
	b, err := json.Marshal(&d)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc), "%s", b)

	seen := checkShown(t, doc, d.caps, capsViews)
	for _, k := range []string{"bdf", "vfio", "interface_version", "transport", "atomic_cap", "ports", "quirks", "srq"} {
		seen[k] = true
	}
	for k := range doc {
		assert.True(t, seen[k], "%q is neither a capability nor a key info adds", k)
	}
	assert.Equal(t, "0.0.1", doc["fw_ver"])
	assert.Equal(t, "cdev", doc["vfio"], "the VFIO path the device was taken through")
	assert.Equal(t, "0000:0000:0000:0002", doc["node_guid"])

	ports := doc["ports"].([]any)
	require.Len(t, ports, 1)
	port := ports[0].(map[string]any)
	seen = checkShown(t, port, d.port, portViews)
	for _, k := range []string{"port", "link_layer", "gids"} {
		seen[k] = true
	}
	for k := range port {
		assert.True(t, seen[k], "ports[].%q is neither a port attribute nor a key info adds", k)
	}
	assert.Equal(t, "Ethernet", port["link_layer"])

	quirks := doc["quirks"].(map[string]any)
	seen = checkShown(t, quirks, d.quirks, quirksViews)
	assert.Len(t, quirks, len(seen), "quirks holds the quirks alone")
}

// An object with a key twice does not marshal: the document never holds
// one key for two values, where a reader keeps only one.
func TestInfoJSONRefusesAKeyTwice(t *testing.T) {
	_, err := json.Marshal(object{{"max_qp", 1}, {"max_qp", 2}})
	assert.ErrorContains(t, err, `key "max_qp" twice`)
	b, err := json.Marshal(object{{"b", 1}, {"a", "x"}})
	require.NoError(t, err)
	assert.Equal(t, `{"b":1,"a":"x"}`, string(b), "members keep their order")
}

// --vfio takes auto, cdev or group, and not with --model, whose device has
// no VFIO (info then says so); a bad value is a usage error before any
// device is reached.
func TestVFIOFlagTakesAutoCDevOrGroupAndInfoShowsThePath(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--vfio", "iommufd", "info"}, "--vfio iommufd: want auto, cdev or group"},
		{[]string{"--model", "v20", "--vfio", "cdev", "info"}, "the model has no VFIO"},
		{[]string{"--model", "v20", "--vfio", "group", "info"}, "the model has no VFIO"},
	} {
		var out, errOut bytes.Buffer
		e := &env{out: &out, errOut: &errOut}
		assert.Equal(t, 2, run(e, tc.args), "%q", tc.args)
		assert.Contains(t, errOut.String(), tc.says, "%q", tc.args)
		assert.Zero(t, e.reached, "%q reached for a device", tc.args)
	}
	var out, errOut bytes.Buffer
	e := &env{out: &out, errOut: &errOut}
	require.Equal(t, 0, run(e, []string{"--model", "v20", "--vfio", "auto", "info"}), errOut.String())
	assert.Contains(t, out.String(), "vfio:                  none (the model)\n")
}

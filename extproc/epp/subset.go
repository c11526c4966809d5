package epp

import (
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/wire"
)

// readSubsetHint returns the proxy's restriction of the candidates, or nil
// when it sent none. The value is accepted as a list of strings or as one
// comma-separated string, since proxies send both.
func readSubsetHint(md server.Metadata) *datastore.AddressSet {
	st := md[wire.SubsetHintNamespace]
	if st == nil {
		return nil
	}
	v, ok := st.GetFields()[wire.SubsetKey]
	if !ok {
		return nil
	}
	set := datastore.NewAddressSet()
	var add func(v *structpb.Value)
	add = func(v *structpb.Value) {
		switch x := v.GetKind().(type) {
		case *structpb.Value_StringValue:
			set.AddList(x.StringValue)
		case *structpb.Value_ListValue:
			for _, item := range x.ListValue.GetValues() {
				add(item)
			}
		}
	}
	add(v)
	return set
}

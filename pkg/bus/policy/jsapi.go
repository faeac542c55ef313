package policy

// JetStream API subjects, as nats-server names them (server/jetstream_api.go): each
// request names its stream (and consumer) in the subject, so that permissions can
// confine a role to its own streams. Found by running the services against these
// permissions, not by guessing: a missing subject shows as a permission violation.
const (
	jsAPI = "$JS.API."
	jsAck = "$JS.ACK."
	// jsFC is where a push consumer's client answers the server's flow-control
	// requests ($JS.FC.<stream>.<consumer>.<id>): until it does, the server sends
	// that consumer nothing more.
	jsFC = "$JS.FC."
)

// streamManage creates, updates and looks up a stream (not delete, not purge).
func streamManage(stream string) []string {
	return []string{
		jsAPI + "STREAM.CREATE." + stream,
		jsAPI + "STREAM.UPDATE." + stream,
		jsAPI + "STREAM.INFO." + stream,
	}
}

// streamRead reads a stream's messages by sequence or subject, and nothing else:
// no consumers, because whoever may create or pull a consumer by name may also
// reconfigure or drain another role's durable.
func streamRead(stream string) []string {
	return []string{
		jsAPI + "STREAM.INFO." + stream,
		jsAPI + "STREAM.MSG.GET." + stream,
		jsAPI + "DIRECT.GET." + stream,
		jsAPI + "DIRECT.GET." + stream + ".>",
	}
}

// durable creates, reads, pulls from and acks one named consumer of a stream.
func durable(stream, name string) []string {
	return []string{
		jsAPI + "CONSUMER.CREATE." + stream + "." + name,
		jsAPI + "CONSUMER.CREATE." + stream + "." + name + ".>",
		jsAPI + "CONSUMER.DURABLE.CREATE." + stream + "." + name,
		jsAPI + "CONSUMER.INFO." + stream + "." + name,
		jsAPI + "CONSUMER.MSG.NEXT." + stream + "." + name,
		jsAck + stream + "." + name + ".>",
	}
}

// kvBucket is everything a key-value bucket's owner does: create and look it up,
// get, put and delete keys, watch them (ordered consumers of its stream, which
// are push consumers with flow control: the watcher must answer the server's
// flow-control requests on its stream, or the watch stalls once a burst of writes
// fills its window).
func kvBucket(bucket string) []string {
	stream := "KV_" + bucket
	return append(append(streamManage(stream), streamRead(stream)[1:]...),
		jsAPI+"CONSUMER.CREATE."+stream,
		jsAPI+"CONSUMER.CREATE."+stream+".>",
		jsAPI+"CONSUMER.DELETE."+stream+".>",
		jsAPI+"CONSUMER.INFO."+stream+".>",
		jsAPI+"CONSUMER.MSG.NEXT."+stream+".>",
		jsFC+stream+".>",
		"$KV."+bucket+".>",
		jsAPI+"INFO", // account info: nats.go checks the account's limits before creating a bucket
	)
}

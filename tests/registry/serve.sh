# A docker-registry of the test's own on 127.0.0.1, and free ports: sourced
# by the scripts that pull and push (tests/registry/*.sh,
# tests/daemon/crash.sh).

# free_port: a port of 127.0.0.1 that nothing listens on now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_port PORT: waits up to 10 s for something to listen on PORT;
# fails if nothing does.
wait_port() {
	for _ in $(seq 100); do
		python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 0.1)" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

# start_registry DIR [YAML]: docker-registry on a free port, keeping its
# blobs in DIR, its configuration in DIR.yml (YAML added to it: an `auth:`
# section) and its log in DIR.log. Sets $registry_port and $registry_pid,
# once it listens; fails with its log on stderr if it does not.
start_registry() {
	registry_port=$(free_port)
	mkdir -p "$1"
	cat >"$1.yml" <<-YML
		version: 0.1
		log:
		  level: error
		storage:
		  filesystem:
		    rootdirectory: $1
		http:
		  addr: 127.0.0.1:$registry_port
		${2:-}
	YML
	docker-registry serve "$1.yml" >>"$1.log" 2>&1 &
	registry_pid=$!
	wait_port "$registry_port" || { cat "$1.log" >&2; return 1; }
}

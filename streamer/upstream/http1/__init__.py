"""The lean HTTP/1.1 client: a sans-I/O response parser, connections, pools."""

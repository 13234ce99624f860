"""`tracefleet dashboard`: a live, read-only web page of the jobs and training loops under a folder or bucket
(source: what it reads; figures: what it computes; charts: server-side SVG; pages: the HTML; app: the routes)."""

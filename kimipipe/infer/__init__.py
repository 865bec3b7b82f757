"""kp-infer's run, in rooms of one job each (the entry point: `run.run_infer`).

    config.py          RunConfig: the configuration of a run, in the parts each room reads
                       (Files, Money, Sending, Retries, IdentityCheck; every limit once)
    options.py         kp-infer's options, each a typed field of InferOptions (its click
                       declaration, --help section, the field it fills; commands/infer.py's
                       `run_config` builds RunConfig from them)
    prepare.py         before anything is sent, in order: the input, previous work, the
                       partition's counts, the endpoints, the servers, --total-cost
    inputs.py          the input read whole first (stdin spooled): every line checked, the
                       IDs and sums kept (InputScan), --sample
    resume.py          previous work: the rescue file taken in, the IDs done, the spend and
                       tokens recorded, another API's records refused, the quarantine kept
    endpoints.py       the endpoints table and the model's entry: the price bound, the
                       routing warnings (re-quantized, one endpoint left), distillation
    run.py             the run: the input's prompts admitted in turn, stops, draining,
                       signals (bounded by --grace in every phase), the balance read at
                       the start and polled; `run_infer`, what commands/infer.py calls
    admission.py       what a request holds to be sent, one `Ticket` taken and given back
                       in one place (a concurrency slot, the caps' reservation, money in
                       flight, disk room); the one wait for the caps' room (kinds.Cap)
    prompt_work.py     one admitted prompt's attempts and answers (`PromptWork`, given the
                       run's parts, `RunParts`, and its ticket):
                       one handler per attempt kind (kinds.AttemptKind): retries and
                       backoff, in-flight 402s waited out, money limits as stops, refused
                       answers sent again, its record or failure written
    conversations.py   prompts with follow_ups asked turn by turn on the model's own answers:
                       each turn's history and record, the queue whose next turns go ahead
                       of new prompts, resume from the output's turns, the recipe check
    state.py           RunState: what the parts of a run share (the stop, what admission
                       waits for, the prompts in progress)
    acceptance.py      which answers are results: the routing, reasoning and think-marker
                       checks, and a refused prompt's next routing
    identity.py        --tokenizer: whether each answer is the target model's (its token
                       counts against the target's), the offset learned, quarantines
                       (its rows per provider: kimipipe/recorded/identity_table.py);
                       identity_votes.py the verdict the providers' evidence gives;
                       preflight_identity.py the preflight's request to each provider
    availability.py    how many endpoints are left (--plan, --preflight)
    writing.py         the outputs checked writable and locked; response and failure
                       records, the writers and their rescue files
                       (`api` on every record: kimipipe/recorded/api.py)
    report.py          Stats (the run's counts, each written by a method of its own),
                       the exit code (kinds.StopReason's), the summary
    progress.py        the progress line: the run's snapshot (`RunProgress`), fitted to the
                       terminal, and when it is redrawn
    report_files.py    `kp-infer report FILE...`: the providers compared (one row per
                       provider, kimipipe/recorded/providers_table.py) from files on disk
    preflight.py       `--preflight [N]`: N real requests that check what the run assumes
                       (sent by the run's transport with a tap: openrouter/probe.py);
                       preflight_checks.py each check's verdict, the report's table
    plan.py            --plan: the routing table, the cost estimate, what the balance keeps
                       in flight
    budget.py          money and tokens: worst-case reservations against the caps
    costs.py           an answer whose usage shows no cost: GET /generation, else an
                       estimate that cannot fall short, before its record is written
    inflight.py        money in flight: the worst cases running, under a ceiling sized to
                       the balance and learned from OpenRouter's in-flight 402s
    total_cost.py      --total-cost: one cap shared by the runs of a build (reservations file)
    disk.py            the disk guard: admission waits while the output's free space is short
    rescue.py          answers a failing output cannot take, kept for the next run (--rescue)
    limiter.py         adaptive concurrency (shrinks on 429s, grows back)
    transport.py       the HTTP transport (OpenRouter's client, or the --server Sources),
                       and the paced turns of the event loop at many requests in flight
    servers.py         --server: self-hosted servers as sources beside (or instead of)
                       OpenRouter, the request as a server takes it
    discovery.py       each --server asked what it serves (GET /v1/models) before the run
"""

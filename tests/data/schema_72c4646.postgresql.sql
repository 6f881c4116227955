-- The state database's schema as spotrain made it at commit 72c4646 (before Alembic): PostgreSQL.
-- Captured from that commit's models (Store(url) on an empty database); tests/test_migrations.py upgrades it.
CREATE TABLE agent_assignments (
	instance_id VARCHAR(80) NOT NULL,
	job_id VARCHAR(80) NOT NULL,
	attempt INTEGER NOT NULL,
	launch_json TEXT NOT NULL,
	notice_json TEXT,
	stop_attempt INTEGER NOT NULL,
	assigned_at FLOAT NOT NULL,
	PRIMARY KEY (instance_id)
);
CREATE INDEX ix_agent_assignments_job_id ON agent_assignments (job_id);
CREATE TABLE agent_progress (
	job_id VARCHAR(80) NOT NULL,
	attempt INTEGER NOT NULL,
	progress_json TEXT NOT NULL,
	reported_at FLOAT NOT NULL,
	PRIMARY KEY (job_id)
);
CREATE TABLE agent_reports (
	instance_id VARCHAR(80) NOT NULL,
	attempt INTEGER NOT NULL,
	state VARCHAR(16) NOT NULL,
	exit_codes_json TEXT NOT NULL,
	notice_json TEXT,
	address VARCHAR(64),
	first_report_at FLOAT NOT NULL,
	reported_at FLOAT NOT NULL,
	PRIMARY KEY (instance_id)
);
CREATE TABLE jobs (
	job_id VARCHAR(80) NOT NULL,
	name VARCHAR(64) NOT NULL,
	controller_id VARCHAR(80) NOT NULL,
	cloud VARCHAR(16) NOT NULL,
	spec_json TEXT NOT NULL,
	workdir TEXT NOT NULL,
	checkpoint_uri TEXT NOT NULL,
	state VARCHAR(24) NOT NULL,
	reason TEXT NOT NULL,
	submitted_at FLOAT NOT NULL,
	submitted_clock_s FLOAT NOT NULL,
	finished_at FLOAT,
	finished_clock_s FLOAT,
	attempt INTEGER NOT NULL,
	gang_attempt INTEGER NOT NULL,
	gang_port INTEGER NOT NULL,
	gang_started_at FLOAT,
	gang_stopping VARCHAR(32) NOT NULL,
	gang_stop_deadline FLOAT,
	restarts_on_errors INTEGER NOT NULL,
	gang_start_step BIGINT NOT NULL,
	stalled_restarts INTEGER NOT NULL,
	preemptions INTEGER NOT NULL,
	cost_usd FLOAT NOT NULL,
	on_demand_cost_usd FLOAT NOT NULL,
	step BIGINT NOT NULL,
	total_steps BIGINT,
	metric FLOAT,
	metric_name VARCHAR(64) NOT NULL,
	loss FLOAT,
	final_model TEXT,
	last_checkpoint_step BIGINT,
	restart_overhead_s FLOAT,
	scenario_json TEXT NOT NULL,
	profile_json TEXT NOT NULL,
	grad_sqr FLOAT,
	grad_var FLOAT,
	batch_json TEXT NOT NULL,
	cancel_requested TEXT DEFAULT '' NOT NULL,
	PRIMARY KEY (job_id)
);
CREATE INDEX ix_jobs_controller_id ON jobs (controller_id);
CREATE INDEX ix_jobs_name ON jobs (name);
CREATE INDEX ix_jobs_state ON jobs (state);
CREATE TABLE leases (
	name VARCHAR(80) NOT NULL,
	holder VARCHAR(200) NOT NULL,
	holder_json TEXT NOT NULL,
	epoch BIGINT NOT NULL,
	version BIGINT NOT NULL,
	ttl_s FLOAT NOT NULL,
	renewed_at FLOAT NOT NULL,
	expires_at FLOAT NOT NULL,
	PRIMARY KEY (name)
);
CREATE TABLE progress_samples (
	id SERIAL NOT NULL,
	job_id VARCHAR(80) NOT NULL,
	ts FLOAT NOT NULL,
	clock_s FLOAT NOT NULL,
	step BIGINT NOT NULL,
	checkpoint_step BIGINT NOT NULL,
	PRIMARY KEY (id)
);
CREATE INDEX ix_progress_samples_job_id ON progress_samples (job_id);
CREATE TABLE decisions (
	decision_id VARCHAR(80) NOT NULL,
	job_id VARCHAR(80) NOT NULL,
	offering_key VARCHAR(160) NOT NULL,
	market VARCHAR(16) NOT NULL,
	created_at FLOAT NOT NULL,
	status VARCHAR(16) NOT NULL,
	instance_id VARCHAR(80),
	reason TEXT NOT NULL,
	PRIMARY KEY (decision_id),
	FOREIGN KEY(job_id) REFERENCES jobs (job_id)
);
CREATE INDEX ix_decisions_job_id ON decisions (job_id);
CREATE TABLE events (
	id SERIAL NOT NULL,
	job_id VARCHAR(80) NOT NULL,
	ts FLOAT NOT NULL,
	kind VARCHAR(32) NOT NULL,
	from_state VARCHAR(24) NOT NULL,
	to_state VARCHAR(24) NOT NULL,
	reason TEXT NOT NULL,
	PRIMARY KEY (id),
	FOREIGN KEY(job_id) REFERENCES jobs (job_id)
);
CREATE INDEX ix_events_job_id ON events (job_id);
CREATE TABLE instances (
	instance_id VARCHAR(80) NOT NULL,
	job_id VARCHAR(80) NOT NULL,
	cloud VARCHAR(16) NOT NULL,
	offering_key VARCHAR(160) NOT NULL,
	market VARCHAR(16) NOT NULL,
	region VARCHAR(64) NOT NULL,
	tags_json TEXT NOT NULL,
	gpus INTEGER NOT NULL,
	state VARCHAR(16) NOT NULL,
	decision_id VARCHAR(80) NOT NULL,
	launched_at_s FLOAT NOT NULL,
	terminated_at_s FLOAT,
	interruption VARCHAR(64),
	notice_delivered INTEGER NOT NULL,
	attempt INTEGER NOT NULL,
	first_rank INTEGER NOT NULL,
	billed_seconds FLOAT NOT NULL,
	cost_usd FLOAT NOT NULL,
	on_demand_cost_usd FLOAT NOT NULL,
	PRIMARY KEY (instance_id),
	FOREIGN KEY(job_id) REFERENCES jobs (job_id)
);
CREATE INDEX ix_instances_decision_id ON instances (decision_id);
CREATE INDEX ix_instances_job_id ON instances (job_id);
CREATE INDEX ix_instances_state ON instances (state);
CREATE INDEX ix_jobs_controller_state ON jobs (controller_id, state);
CREATE INDEX ix_decisions_status ON decisions (status);

"""The jobs' log files: tailing, the failure-signature library, crash findings, the access policy, and the two
activities that read them (the job watch and the attribution's settle window). The scheduler comes in as a port."""

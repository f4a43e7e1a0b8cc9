"""Amazon SQS compatibility (issue #18): the pure parts, no I/O (docs/sqs.md).

sigv4     verifies AWS Signature Version 4 on a request (header or presigned query form)
protocol  the AWS JSON 1.0 protocol as boto3 speaks it to SQS: requests, limits, errors, MD5s
queue_url maps queue URLs to (vhost, queue) and back
receipt   tamper-evident receipt handles
"""
